//! The identities of the toolsrv link and their secrets, derived from a per-session master
//! key (both ends use this; toolsrv's side of the exchange is `ollie_toolsrv::auth`).
//!
//! The seed trusted the first client to write a secret. Here olliesrv creates a random
//! 32-byte master key per toolsrv and hands it over an inherited fd; the secret of each
//! identity is derived from it, so knowing one agent's secret says nothing about another's:
//!
//! - agent `A`: `HMAC-SHA256(master, "ollie-agent\0" || A)`
//! - the operator (the human, through olliesrv): `HMAC-SHA256(master, "ollie-operator\0")`
//!
//! The exchange: `Tauth(afid, uname, aname)`, write the secret (32 raw bytes or 64 hex
//! digits, optionally newline-terminated) to the afid, read a session token back, then
//! `Tattach(fid, afid, uname, aname)` with the same uname and aname. Verification is
//! constant-time (`Mac::verify_slice`). A wrong secret kills the afid (no second guess on
//! it); an afid attaches once.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

/// The aname of the operator identity. Agent ids can never take this name.
pub const OPERATOR: &str = "operator";

/// Longest agent id accepted.
pub const MAX_AGENT_ID: usize = 128;

/// The per-session master key. Never printed.
#[derive(Clone)]
pub struct MasterKey([u8; 32]);

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl MasterKey {
    /// A fresh random key from the kernel's CSPRNG.
    pub fn generate() -> std::io::Result<MasterKey> {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(MasterKey(k))
    }

    /// A key from its 32 bytes.
    pub fn from_bytes(b: [u8; 32]) -> MasterKey {
        MasterKey(b)
    }

    /// The raw bytes (to hand to toolsrv over its boot fd).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn mac(&self, id: &Identity) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; 32 bytes cannot fail.
        let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable_key(),
        };
        match id {
            Identity::Operator => m.update(b"ollie-operator\0"),
            Identity::Agent(a) => {
                m.update(b"ollie-agent\0");
                m.update(a.as_bytes());
            }
        }
        m
    }

    /// The secret of `id`.
    pub fn secret(&self, id: &Identity) -> [u8; 32] {
        self.mac(id).finalize().into_bytes().into()
    }

    /// Whether `secret` is the secret of `id`, compared in constant time.
    pub fn verify(&self, id: &Identity, secret: &[u8]) -> bool {
        self.mac(id).verify_slice(secret).is_ok()
    }
}

#[cold]
fn unreachable_key() -> ! {
    // `new_from_slice` only fails for MACs with a fixed key size; HMAC has none.
    std::process::abort()
}

/// Who a connection acts for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// The human operator (through olliesrv): sees and controls everything.
    Operator,
    /// One agent: sees and controls only its own processes and tools.
    Agent(String),
}

impl Identity {
    /// The identity an aname names, or why it is not valid.
    pub fn from_aname(aname: &str) -> Result<Identity, String> {
        if aname == OPERATOR {
            return Ok(Identity::Operator);
        }
        validate_agent_id(aname)?;
        Ok(Identity::Agent(aname.to_owned()))
    }

    /// The aname of this identity.
    pub fn aname(&self) -> &str {
        match self {
            Identity::Operator => OPERATOR,
            Identity::Agent(a) => a,
        }
    }

    /// Whether this identity may see and control things owned by agent `owner`.
    pub fn may_act_for(&self, owner: &str) -> bool {
        match self {
            Identity::Operator => true,
            Identity::Agent(a) => a == owner,
        }
    }
}

/// Agent ids: 1 to [`MAX_AGENT_ID`] bytes of `A-Z a-z 0-9 . _ -`, not starting with `.`,
/// and not the operator's name.
pub fn validate_agent_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("empty agent id".into());
    }
    if id == OPERATOR {
        return Err(format!("{OPERATOR:?} is reserved for the operator"));
    }
    if id.len() > MAX_AGENT_ID {
        return Err(format!(
            "agent id is {} bytes; at most {MAX_AGENT_ID}",
            id.len()
        ));
    }
    if id.starts_with('.')
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "agent id {:?} may only contain A-Z a-z 0-9 . _ - and must not start with '.'",
            id.escape_debug().to_string()
        ));
    }
    Ok(())
}

/// Decodes a secret as written to an afid: 32 raw bytes, or 64 hex digits with an optional
/// trailing newline.
pub fn decode_secret(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() == 32 {
        return Some(data.to_vec());
    }
    let hex = data.strip_suffix(b"\n").unwrap_or(data);
    if hex.len() != 64 {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    hex.chunks(2)
        .map(|p| Some(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

/// Lowercase hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::{Hmac, Mac};
    use sha2::Sha256;

    fn key() -> MasterKey {
        MasterKey::from_bytes([7u8; 32])
    }

    #[test]
    fn secrets_differ_per_identity_and_match_the_formula() {
        let k = key();
        let a = Identity::Agent("a1".into());
        let b = Identity::Agent("b1".into());
        assert_ne!(k.secret(&a), k.secret(&b));
        assert_ne!(k.secret(&a), k.secret(&Identity::Operator));
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&[7u8; 32]).unwrap();
        m.update(b"ollie-agent\0a1");
        let want: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(k.secret(&a), want);
        assert!(k.verify(&a, &want));
        assert!(!k.verify(&b, &want));
        assert!(!k.verify(&a, &want[..31]));
    }

    #[test]
    fn secret_encodings() {
        let s = [0xabu8; 32];
        assert_eq!(decode_secret(&s).unwrap(), s.to_vec());
        let h = hex(&s);
        assert_eq!(decode_secret(h.as_bytes()).unwrap(), s.to_vec());
        assert_eq!(
            decode_secret(format!("{h}\n").as_bytes()).unwrap(),
            s.to_vec()
        );
        assert_eq!(
            decode_secret(h.to_uppercase().as_bytes()).unwrap(),
            s.to_vec()
        );
        assert!(decode_secret(b"short").is_none());
        let mut bad = h.clone().into_bytes();
        bad[3] = b'g';
        assert!(decode_secret(&bad).is_none());
    }

    #[test]
    fn agent_ids() {
        assert!(validate_agent_id("8c1e-4f.x_y").is_ok());
        for bad in ["", "operator", ".hidden", "a/b", "a b", "a\0", "é"] {
            assert!(validate_agent_id(bad).is_err(), "{bad:?}");
        }
        assert!(validate_agent_id(&"x".repeat(MAX_AGENT_ID + 1)).is_err());
        assert_eq!(
            Identity::from_aname("operator").unwrap(),
            Identity::Operator
        );
        assert!(Identity::Operator.may_act_for("a"));
        assert!(!Identity::Agent("b".into()).may_act_for("a"));
    }
}
