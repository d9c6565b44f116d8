//! Export: records as JSON lines and as IPFIX (RFC 7011) messages.
//!
//! Both encoders are sans-I/O: they turn checked records
//! ([`anode_monitor_apps::abi::Record`]) into bytes the caller writes to a
//! file or a socket.
//!
//! # IPFIX
//!
//! Each message carries the records of one module, with the module's id as
//! the Observation Domain ID. A record kind (its schema and element list)
//! gets a template the first time it is exported (template IDs from 256 up,
//! per domain); the template set precedes the data set in the same message.
//! Over a file or a stream one template announcement suffices (RFC 7011
//! §8.1); [`IpfixEncoder::reset_templates`] re-announces them (e.g. for UDP,
//! §8.4, every few minutes). Elements map to IANA information elements where
//! one exists (`sourceIPv4Address`, `observationTimeNanoseconds`,
//! `digestHashValue`, …) and to enterprise-specific elements under the
//! documentation PEN 32473 (RFC 5612) otherwise; see
//! [`anode_monitor_apps::abi::Element`]. Times are encoded as
//! `dateTimeNanoseconds`: NTP seconds since 1900 and a binary fraction.

use std::collections::HashMap;

use anode_monitor_apps::abi::{Element, Kind, Record, be_uint};

/// IPFIX protocol version.
pub const IPFIX_VERSION: u16 = 10;
/// The IANA-assigned IPFIX port.
pub const IPFIX_PORT: u16 = 4739;
/// Template set id.
pub const TEMPLATE_SET: u16 = 2;
/// Seconds between 1900-01-01 (NTP) and 1970-01-01 (Unix).
pub const NTP_UNIX_OFFSET: u64 = 2_208_988_800;
const MAX_MESSAGE: usize = 65_535;

fn ntp(ns: u64) -> [u8; 8] {
    let secs = ns / 1_000_000_000 + NTP_UNIX_OFFSET;
    let frac = (((ns % 1_000_000_000) as u128) << 32) / 1_000_000_000;
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&(secs as u32).to_be_bytes());
    out[4..].copy_from_slice(&(frac as u32).to_be_bytes());
    out
}

/// Renders one record as a JSON object on one line (no newline).
pub fn json_line(module: &str, module_id: u32, rec: &Record<'_>) -> String {
    let mut s = String::with_capacity(160);
    s.push_str("{\"module\":");
    s.push_str(&serde_json::to_string(module).unwrap_or_else(|_| "\"?\"".into()));
    s.push_str(&format!(",\"module_id\":{module_id},\"schema\":{}", rec.schema));
    for (e, v) in rec.items() {
        s.push_str(",\"");
        s.push_str(e.json_key());
        s.push_str("\":");
        match e.kind() {
            Kind::Unsigned | Kind::TimeNs => s.push_str(&be_uint(v).to_string()),
            Kind::Ipv4 => {
                if let [a, b, c, d] = v {
                    s.push_str(&format!("\"{a}.{b}.{c}.{d}\""));
                }
            }
            Kind::Ipv6 => {
                let a: [u8; 16] = v.try_into().unwrap_or([0; 16]);
                s.push_str(&format!("\"{}\"", std::net::Ipv6Addr::from(a)));
            }
            Kind::Float => {
                let f = f64::from_bits(be_uint(v));
                if f.is_finite() {
                    s.push_str(&format!("{f:.6}"));
                } else {
                    s.push_str("null");
                }
            }
            Kind::Char => {
                let c = v.first().copied().unwrap_or(b'?');
                let c = if c.is_ascii_graphic() { c as char } else { '?' };
                s.push_str(&serde_json::to_string(&c.to_string()).unwrap_or_default());
            }
        }
    }
    s.push('}');
    s
}

/// A record kind's template key: schema and element list.
type TemplateKey = (u32, u8, Vec<Element>);

/// Encodes records into IPFIX messages.
#[derive(Debug, Default)]
pub struct IpfixEncoder {
    templates: HashMap<TemplateKey, u16>,
    next_id: HashMap<u32, u16>,
    sequence: HashMap<u32, u32>,
    /// Messages produced.
    pub messages: u64,
    /// Data records produced.
    pub records: u64,
}

fn set_header(out: &mut Vec<u8>, id: u16) -> usize {
    let at = out.len();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    at
}

fn close(out: &mut [u8], at: usize) {
    let len = (out.len() - at) as u16;
    if let Some(s) = out.get_mut(at + 2..at + 4) {
        s.copy_from_slice(&len.to_be_bytes());
    }
}

impl IpfixEncoder {
    /// A new encoder.
    pub fn new() -> IpfixEncoder {
        IpfixEncoder::default()
    }

    /// Forgets which templates were announced, so they are sent again.
    pub fn reset_templates(&mut self) {
        self.templates.clear();
        self.next_id.clear();
    }

    /// Encodes `records` of observation domain `domain` (the module) into
    /// one or more messages appended to `out`; `export_secs` is the export
    /// time (Unix seconds). Returns the number of messages.
    pub fn encode(&mut self, domain: u32, export_secs: u32, records: &[Record<'_>], out: &mut Vec<u8>) -> usize {
        let mut msgs = 0;
        let mut i = 0;
        while i < records.len() {
            let start = out.len();
            out.extend_from_slice(&IPFIX_VERSION.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&export_secs.to_be_bytes());
            out.extend_from_slice(&self.sequence.get(&domain).copied().unwrap_or(0).to_be_bytes());
            out.extend_from_slice(&domain.to_be_bytes());
            // Records of one template go into one data set; a new template
            // first gets a template set. Stop before the message overflows.
            while i < records.len() {
                let r = &records[i];
                let schema = r.schema;
                let elems: Vec<Element> = r.items().map(|(e, _)| e).collect();
                let key = (domain, schema, elems.clone());
                let mut need = 4 + r.items().map(|(e, _)| e.size()).sum::<usize>();
                let known = self.templates.get(&key).copied();
                if known.is_none() {
                    need += 8 + elems.len() * 8;
                }
                if out.len() - start + need > MAX_MESSAGE {
                    break;
                }
                let id = match known {
                    Some(id) => id,
                    None => {
                        let next = self.next_id.entry(domain).or_insert(256);
                        let id = *next;
                        *next = next.wrapping_add(1).max(256);
                        self.templates.insert(key, id);
                        let at = set_header(out, TEMPLATE_SET);
                        out.extend_from_slice(&id.to_be_bytes());
                        out.extend_from_slice(&(elems.len() as u16).to_be_bytes());
                        for e in &elems {
                            let (pen, ie) = e.ipfix();
                            let ie = if pen != 0 { ie | 0x8000 } else { ie };
                            out.extend_from_slice(&ie.to_be_bytes());
                            out.extend_from_slice(&(e.size() as u16).to_be_bytes());
                            if pen != 0 {
                                out.extend_from_slice(&pen.to_be_bytes());
                            }
                        }
                        close(out, at);
                        id
                    }
                };
                // Consecutive records of the same template share a data set.
                let at = set_header(out, id);
                while i < records.len() {
                    let r = &records[i];
                    if r.schema != schema || !same_elems(r, &elems) {
                        break;
                    }
                    let len: usize = r.items().map(|(e, _)| e.size()).sum();
                    if out.len() - start + len > MAX_MESSAGE {
                        break;
                    }
                    for (e, v) in r.items() {
                        if e.kind() == Kind::TimeNs {
                            out.extend_from_slice(&ntp(be_uint(v)));
                        } else {
                            out.extend_from_slice(v);
                        }
                    }
                    self.records += 1;
                    let seq = self.sequence.entry(domain).or_insert(0);
                    *seq = seq.wrapping_add(1);
                    i += 1;
                }
                close(out, at);
            }
            let len = (out.len() - start) as u16;
            out[start + 2..start + 4].copy_from_slice(&len.to_be_bytes());
            self.messages += 1;
            msgs += 1;
            if out.len() - start <= 16 {
                // Nothing fitted (cannot happen with MAX_RECORD-sized records); avoid looping.
                out.truncate(start);
                break;
            }
        }
        msgs
    }
}

fn same_elems(r: &Record<'_>, elems: &[Element]) -> bool {
    r.len() == elems.len() && r.items().zip(elems).all(|((a, _), b)| a == *b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anode_monitor_apps::abi::RecordBuilder;

    #[test]
    fn ntp_time_of_the_unix_epoch_and_half_a_second() {
        assert_eq!(ntp(0), [0x83, 0xaa, 0x7e, 0x80, 0, 0, 0, 0]);
        assert_eq!(ntp(500_000_000)[4..], [0x80, 0, 0, 0]);
    }

    #[test]
    fn one_template_then_data_records() {
        let mut b = RecordBuilder::new(3);
        b.uint(Element::Ts, 1_000_000_000).bytes(Element::Src4, &[10, 0, 0, 1]).uint(Element::RttNs, 42);
        let bytes = b.as_bytes().to_vec();
        let r = Record::parse(&bytes).unwrap_or_else(|e| panic!("{e:?}"));
        let mut enc = IpfixEncoder::new();
        let mut out = Vec::new();
        assert_eq!(enc.encode(7, 100, &[r, r], &mut out), 1);
        // header 16 + template set (4 + 4 + 3 fields: 4 + 4 + 8) + data set (4 + 2 × 20)
        assert_eq!(out.len(), 16 + 24 + 44);
        assert_eq!(&out[..4], &[0, 10, 0, 84]);
        assert_eq!(&out[12..16], &7u32.to_be_bytes());
        assert_eq!(&out[16..18], &[0, 2]);
        assert_eq!(&out[40..42], &[1, 0]); // data set id 256
        out.clear();
        enc.encode(7, 101, &[r], &mut out);
        assert_eq!(out.len(), 16 + 4 + 20, "template not repeated");
        assert_eq!(&out[8..12], &2u32.to_be_bytes(), "sequence counts data records");
    }

    #[test]
    fn json_line_renders_addresses_numbers_and_floats() {
        let mut b = RecordBuilder::new(5);
        b.uint(Element::Ts, 5)
            .float(Element::Hurst, 0.75)
            .bytes(Element::Src4, &[1, 2, 3, 4])
            .uint(Element::Variant, u64::from(b'N'));
        let bytes = b.as_bytes().to_vec();
        let r = Record::parse(&bytes).unwrap_or_else(|e| panic!("{e:?}"));
        let line = json_line("hurst\"x", 2, &r);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        assert_eq!(v["module"], "hurst\"x");
        assert_eq!(v["hurst"], 0.75);
        assert_eq!(v["src"], "1.2.3.4");
        assert_eq!(v["variant"], "N");
        assert_eq!(v["ts"], 5);
    }
}
