//! Entry point of the `wire_views` fuzz target (and its seed replay test):
//! arbitrary bytes through every view and Repr of this crate.

use crate::{anep, capture, control, local, plain};

/// Every view is checked, read and (when valid) turned into a Repr that
/// emits the same header back. Must never panic.
pub fn views(data: &[u8]) {
    if let Ok(p) = anep::Packet::new_checked(data) {
        let r = anep::Repr::parse(&p);
        assert_eq!(r.payload_len, p.payload().len());
        assert!(p.payload_start() <= data.len());
        if p.payload_start() == anep::HEADER_LEN {
            let mut b = vec![0u8; r.buffer_len()];
            assert!(r.emit(&mut b).is_ok());
            assert_eq!(b[..anep::HEADER_LEN], data[..anep::HEADER_LEN], "an option-free header re-emits as is");
        }
    }
    let p = anep::Packet::new_unchecked(data);
    let _ = (p.flags(), p.type_id(), p.payload(), p.discard_if_unknown());
    if let Ok(p) = plain::Packet::new_checked(data) {
        let r = plain::Repr::parse(&p);
        let mut b = [0u8; plain::HEADER_LEN];
        assert!(r.emit(&mut b).is_ok());
        assert_eq!(b[..], data[..plain::HEADER_LEN], "a plain header re-emits as is");
    }
    if let Ok(m) = control::Message::parse(data) {
        let mut v = Vec::new();
        assert!(m.emit(&mut v).is_ok());
        assert_eq!(v, data, "a control message re-encodes byte for byte");
    }
    if let Ok(r) = local::Request::decode(data) {
        assert_eq!(local::Request::decode(&r.encode()), Ok(r));
    }
    if let Ok(r) = local::Reply::decode(data) {
        assert_eq!(local::Reply::decode(&r.encode()), Ok(r));
    }
    if let Ok(f) = capture::Frame::parse(data) {
        let mut v = Vec::new();
        assert!(f.emit(&mut v).is_ok());
        assert_eq!(v, data, "a capture frame re-encodes byte for byte");
    }
    if let Ok(Some(n)) = capture::frame_len(data) {
        assert!(n <= capture::FRAME_HEADER + capture::MAX_BODY);
    }
    if let Ok(line) = core::str::from_utf8(data)
        && let Ok(r) = capture::Request::parse(line)
    {
        assert_eq!(capture::Request::parse(&r.to_line()), Ok(r));
    }
}

#[cfg(test)]
mod tests {
    /// Seeds of the fuzz target, and deterministic mutations of them.
    #[test]
    fn seeds_and_mutations() {
        let mut seeds: Vec<Vec<u8>> = vec![
            vec![0x01, 0x80, 0xa0, 0x01, 0x00, 0x02, 0x00, 0x0c, 1, 2, 3, 4],
            vec![1, 0, 0xA0, 0x01, 0, 4, 0, 18, 0, 7, 0, 2, 9, 9, 9, 9, b'x', b'y'],
            vec![10, 0, 0, 3, 10, 0, 0, 1, 64, 0, 0, 9, b'h', b'i'],
            vec![1, 2, b'a', b'b', 0, 0, 0, 1, b'c', b'z'],
            vec![0x81, 2, 4, b'n', b'o'],
            vec![0x02, 0x1b, 0x58],
            b"capture iface=east queue=64".to_vec(),
            vec![
                2, 0, 0, 0, 26, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9, 127, 0, 0, 1, 0x13, 0x88, 127, 0, 0, 1, 0x13, 0x89, 1, 2,
                3, 4,
            ],
            vec![1, 0, 0, 0, 11, 1, 1, 0, 1, 2, 3, 4, 0, 5, 1, b'x'],
            vec![3, 0, 0, 0, 3, 2, b'n', b'o'],
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/wire_views");
        if let Ok(rd) = std::fs::read_dir(&dir) {
            seeds.extend(rd.flatten().filter_map(|e| std::fs::read(e.path()).ok()));
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for s in &seeds {
            super::views(s);
            for _ in 0..500 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let mut m = s.clone();
                match x % 3 {
                    0 if !m.is_empty() => {
                        let i = (x >> 8) as usize % m.len();
                        m[i] ^= (x >> 32) as u8 | 1;
                    }
                    1 => m.truncate((x >> 8) as usize % (m.len() + 1)),
                    _ => m.push((x >> 16) as u8),
                }
                super::views(&m);
            }
        }
    }
}
