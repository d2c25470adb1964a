//! toolsrv's side of Tauth: the state of each auth fid. The identities, the master key and
//! the secret derivation are shared with the spawning side in `ollie_link::auth`.
//!
//! The exchange: `Tauth(afid, uname, aname)`, write the secret (32 raw bytes or 64 hex
//! digits, optionally newline-terminated) to the afid, read a session token back, then
//! `Tattach(fid, afid, uname, aname)` with the same uname and aname. Verification is
//! constant-time. A wrong secret kills the afid (no second guess on it); an afid attaches
//! once.

pub use ollie_link::auth::{
    Identity, MAX_AGENT_ID, MasterKey, OPERATOR, decode_secret, hex, validate_agent_id,
};

/// The state of one auth fid.
#[derive(Debug)]
pub struct AuthState {
    /// The identity the Tauth named.
    pub identity: Identity,
    /// The uname the Tauth named (the attach must repeat it).
    pub uname: String,
    /// Where the exchange is.
    pub phase: Phase,
}

/// Where an auth exchange is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the secret.
    Fresh,
    /// The secret was right; the token can be read and one attach made.
    Verified { token: String },
    /// A wrong secret was written: the afid is dead.
    Failed,
    /// An attach used it.
    Used,
}

impl AuthState {
    /// A new exchange for `aname`.
    pub fn new(uname: &str, aname: &str) -> Result<AuthState, String> {
        Ok(AuthState {
            identity: Identity::from_aname(aname)?,
            uname: uname.to_owned(),
            phase: Phase::Fresh,
        })
    }

    /// A write to the afid.
    pub fn write(&mut self, key: &MasterKey, data: &[u8]) -> Result<(), String> {
        match self.phase {
            Phase::Fresh => {}
            Phase::Verified { .. } | Phase::Used => {
                return Err("permission denied: already authenticated on this afid".into());
            }
            Phase::Failed => {
                return Err(
                    "permission denied: this afid failed authentication; start a new Tauth".into(),
                );
            }
        }
        let ok = decode_secret(data).is_some_and(|s| key.verify(&self.identity, &s));
        if !ok {
            self.phase = Phase::Failed;
            return Err(format!(
                "permission denied: authentication failed for {:?}",
                self.identity.aname()
            ));
        }
        let mut t = [0u8; 16];
        getrandom::fill(&mut t).map_err(|e| format!("authentication: no randomness: {e}"))?;
        self.phase = Phase::Verified { token: hex(&t) };
        Ok(())
    }

    /// A read of the afid: the token once verified.
    pub fn read(&self) -> Result<String, String> {
        match &self.phase {
            Phase::Verified { token } => Ok(format!("{token}\n")),
            Phase::Used => Err("permission denied: afid already used".into()),
            Phase::Fresh => Err("permission denied: write the secret first".into()),
            Phase::Failed => Err("permission denied: this afid failed authentication".into()),
        }
    }

    /// An attach with this afid: consumes it.
    pub fn attach(&mut self, uname: &str, aname: &str) -> Result<Identity, String> {
        match &self.phase {
            Phase::Verified { .. } => {}
            Phase::Used => return Err("permission denied: afid already used".into()),
            Phase::Fresh => return Err("permission denied: afid not authenticated yet".into()),
            Phase::Failed => {
                return Err("permission denied: afid failed authentication".into());
            }
        }
        if aname != self.identity.aname() {
            return Err(format!(
                "permission denied: attach aname {:?} differs from the authenticated {:?}",
                aname.escape_debug().to_string(),
                self.identity.aname()
            ));
        }
        if uname != self.uname {
            return Err(format!(
                "permission denied: attach uname {:?} differs from the authenticated {:?}",
                uname.escape_debug().to_string(),
                self.uname
            ));
        }
        self.phase = Phase::Used;
        Ok(self.identity.clone())
    }
}

/// 16 random bytes as 32 lowercase hex digits (hold ids).
pub fn random_hex16() -> Result<String, String> {
    let mut t = [0u8; 16];
    getrandom::fill(&mut t).map_err(|e| format!("no randomness: {e}"))?;
    Ok(hex(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> MasterKey {
        MasterKey::from_bytes([7u8; 32])
    }

    #[test]
    fn exchange_refusals() {
        let k = key();
        let a = Identity::Agent("a1".into());
        // Wrong secret kills the afid.
        let mut st = AuthState::new("u", "a1").unwrap();
        assert!(st.write(&k, &[0u8; 32]).is_err());
        assert!(st.write(&k, &k.secret(&a)).is_err());
        assert!(st.attach("u", "a1").is_err());
        // Another identity's secret.
        let mut st = AuthState::new("u", "a1").unwrap();
        assert!(
            st.write(&k, &k.secret(&Identity::Agent("b1".into())))
                .is_err()
        );
        // Right secret: token, one attach, same aname and uname only.
        let mut st = AuthState::new("u", "a1").unwrap();
        assert!(st.read().is_err());
        assert!(st.attach("u", "a1").is_err());
        st.write(&k, &k.secret(&a)).unwrap();
        assert!(st.write(&k, &k.secret(&a)).is_err());
        assert_eq!(st.read().unwrap().len(), 33);
        assert!(st.attach("u", "b1").is_err());
        assert!(st.attach("v", "a1").is_err());
        assert_eq!(st.attach("u", "a1").unwrap(), a);
        assert!(st.attach("u", "a1").is_err());
        assert!(st.read().is_err());
    }
}
