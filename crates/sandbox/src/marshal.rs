//! Safe marshalling: a list of byte strings to bytes and back (the paper's
//! `An_marshal`, generalised from three strings to a bounded list).
//!
//! Format: `u8 version (1)`, `u16 count` (big-endian, ≤ [`MAX_FIELDS`]),
//! then per field `u32 length` (big-endian) and the bytes. Nothing but bytes
//! can be encoded, so nothing decoded can become a handle or a pointer.

/// Most fields in one encoding.
pub const MAX_FIELDS: usize = 256;
/// Largest encoding.
pub const MAX_ENCODED: usize = 64 * 1024;

/// Errors decoding or encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MarshalError {
    /// Too many fields or too many bytes.
    #[error("encoding exceeds {MAX_FIELDS} fields or {MAX_ENCODED} bytes")]
    TooLarge,
    /// Bad version, truncated, or trailing bytes.
    #[error("malformed encoding")]
    Malformed,
}

/// Encodes `fields` into `out` (cleared first).
pub fn encode<'a>(fields: impl ExactSizeIterator<Item = &'a [u8]>, out: &mut Vec<u8>) -> Result<(), MarshalError> {
    out.clear();
    if fields.len() > MAX_FIELDS {
        return Err(MarshalError::TooLarge);
    }
    out.push(1);
    out.extend_from_slice(&(fields.len() as u16).to_be_bytes());
    for f in fields {
        if out.len() + 4 + f.len() > MAX_ENCODED {
            return Err(MarshalError::TooLarge);
        }
        out.extend_from_slice(&(f.len() as u32).to_be_bytes());
        out.extend_from_slice(f);
    }
    Ok(())
}

/// Decodes an encoding into its fields (borrowed).
pub fn decode(b: &[u8]) -> Result<Vec<&[u8]>, MarshalError> {
    if b.len() > MAX_ENCODED {
        return Err(MarshalError::TooLarge);
    }
    if b.len() < 3 || b[0] != 1 {
        return Err(MarshalError::Malformed);
    }
    let n = u16::from_be_bytes([b[1], b[2]]) as usize;
    if n > MAX_FIELDS {
        return Err(MarshalError::TooLarge);
    }
    let mut out = Vec::with_capacity(n);
    let mut p = 3usize;
    for _ in 0..n {
        let len = b.get(p..p + 4).ok_or(MarshalError::Malformed)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        p += 4;
        let end = p.checked_add(len).filter(|&e| e <= b.len()).ok_or(MarshalError::Malformed)?;
        out.push(&b[p..end]);
        p = end;
    }
    if p != b.len() {
        return Err(MarshalError::Malformed);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let mut out = Vec::new();
        let fields: [&[u8]; 3] = [b"code", b"", b"func"];
        encode(fields.iter().copied(), &mut out).unwrap();
        assert_eq!(decode(&out).unwrap(), fields.to_vec());
        assert_eq!(decode(&out[..out.len() - 1]), Err(MarshalError::Malformed));
        let mut trailing = out.clone();
        trailing.push(0);
        assert_eq!(decode(&trailing), Err(MarshalError::Malformed));
        assert_eq!(decode(&[2, 0, 0]), Err(MarshalError::Malformed));
        assert_eq!(decode(&[1, 0xff, 0xff]), Err(MarshalError::TooLarge));
        let many = vec![&b""[..]; 300];
        assert_eq!(encode(many.into_iter(), &mut out), Err(MarshalError::TooLarge));
    }
}
