//! The node's own record of the newest metadata it has trusted.
//!
//! TUF clients keep their trusted metadata so that a repository (or here: a
//! disk, a mirror or a peer) cannot roll them back to an older, still
//! validly signed version, and keep the *latest known time* so that a clock
//! set back cannot revive expired metadata (TUF §5.0; tough's
//! `latest_known_time.json`). The node writes this record after every
//! successful boot; [`crate::verify`] refuses metadata older than it.
//!
//! Format: one small JSON object, at most [`MAX_STATE`] bytes, unknown fields
//! refused.

use serde::{Deserialize, Serialize};

/// Largest state file accepted.
pub const MAX_STATE: usize = 4096;
/// Current format number.
pub const FORMAT: u32 = 1;

/// Highest versions trusted so far, the keys they were trusted under, and
/// the latest known time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootState {
    /// Format number ([`FORMAT`]).
    pub format: u32,
    /// Root metadata version.
    pub root: u32,
    /// Timestamp metadata version.
    pub timestamp: u32,
    /// Snapshot metadata version.
    pub snapshot: u32,
    /// Targets metadata version.
    pub targets: u32,
    /// Digest of the timestamp role's key ids when `timestamp` was recorded:
    /// a rotation of those keys resets the timestamp and snapshot versions
    /// (TUF §5.3.11, recovery from a fast-forward attack).
    pub timestamp_keys: String,
    /// Digest of the snapshot role's key ids, likewise.
    pub snapshot_keys: String,
    /// Latest known time, seconds since the Unix epoch.
    pub latest_known_time: i64,
}

/// Why a state file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Larger than [`MAX_STATE`].
    #[error("boot state of {0} bytes exceeds {MAX_STATE}")]
    TooLarge(usize),
    /// Not the expected JSON.
    #[error("malformed boot state: {0}")]
    Malformed(String),
    /// A format this version does not know.
    #[error("boot state format {0} is not {FORMAT}")]
    Format(u32),
}

impl BootState {
    /// Parses a state file.
    pub fn parse(bytes: &[u8]) -> Result<BootState, StateError> {
        if bytes.len() > MAX_STATE {
            return Err(StateError::TooLarge(bytes.len()));
        }
        let s: BootState = serde_json::from_slice(bytes).map_err(|e| StateError::Malformed(e.to_string()))?;
        if s.format != FORMAT {
            return Err(StateError::Format(s.format));
        }
        Ok(s)
    }

    /// The state file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let s = BootState { format: FORMAT, root: 1, timestamp: 4, latest_known_time: 5, ..BootState::default() };
        assert_eq!(BootState::parse(&s.to_bytes()), Ok(s));
        assert!(matches!(BootState::parse(b"{"), Err(StateError::Malformed(_))));
        assert!(matches!(BootState::parse(&[b' '; MAX_STATE + 1]), Err(StateError::TooLarge(_))));
        let other = BootState { format: 9, ..BootState::default() };
        assert_eq!(BootState::parse(&other.to_bytes()), Err(StateError::Format(9)));
        let extra = String::from_utf8_lossy(&BootState { format: 1, ..BootState::default() }.to_bytes())
            .replace("\"root\"", "\"evil\": 1, \"root\"");
        assert!(matches!(BootState::parse(extra.as_bytes()), Err(StateError::Malformed(_))));
    }
}
