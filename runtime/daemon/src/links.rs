//! Approval links: what an approver follows from an email to approve or
//! reject one gate.
//!
//! A link is `{public_url}/approvals/{token}`, the token being the link's
//! fields (run, step path, approver, decision, expiry) and their HMAC-SHA256
//! under the configured `link_secret`. It is
//! * bound: changing any field breaks the signature, so a link decides that
//!   gate, as that approver, that way, and nothing else;
//! * expiring: at the gate's own expiry, and at most `LIFETIME` after it
//!   was sent;
//! * single use: a decision applies only to a pending gate (the store's
//!   rule), so once any decision is taken every link to the gate only says
//!   so.
//!
//! Following a link only shows what it would do: mail scanners fetch links,
//! so the decision needs the confirmation page's POST.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The longest a link stays valid, for a gate that does not expire sooner.
pub const LIFETIME: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Seconds since the Unix epoch, as links count expiry.
pub fn now_s() -> u64 {
    flow_runtime::time::now_ms() / 1000
}

/// What a link does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    #[serde(rename = "r")]
    pub run_id: String,
    #[serde(rename = "p")]
    pub path: String,
    #[serde(rename = "a")]
    pub approver: String,
    /// Approve (true) or reject.
    #[serde(rename = "y")]
    pub approve: bool,
    /// Seconds since the Unix epoch after which the link is refused.
    #[serde(rename = "e")]
    pub expires_s: u64,
}

/// Why a token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// Not a token this flowd signed (mangled, forged, another secret).
    Invalid,
    Expired,
}

fn mac(secret: &str) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length")
}

/// The token of `link`, signed with `secret`.
pub fn sign(secret: &str, link: &Link) -> String {
    let fields = serde_json::to_vec(link).expect("a link serializes");
    let mut mac = mac(secret);
    mac.update(&fields);
    let signature = mac.finalize().into_bytes();
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(&fields),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// The link `token` stands for, if `secret` signed it and it has not expired
/// at `now_s`.
pub fn verify(secret: &str, token: &str, now_s: u64) -> Result<Link, LinkError> {
    let (fields, signature) = token.split_once('.').ok_or(LinkError::Invalid)?;
    let fields = URL_SAFE_NO_PAD
        .decode(fields)
        .map_err(|_| LinkError::Invalid)?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| LinkError::Invalid)?;
    let mut mac = mac(secret);
    mac.update(&fields);
    // Compared in constant time.
    mac.verify_slice(&signature)
        .map_err(|_| LinkError::Invalid)?;
    let link: Link = serde_json::from_slice(&fields).map_err(|_| LinkError::Invalid)?;
    if now_s > link.expires_s {
        return Err(LinkError::Expired);
    }
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn link() -> Link {
        Link {
            run_id: "r1".into(),
            path: "gates/legal".into(),
            approver: "ana@x.io".into(),
            approve: true,
            expires_s: 1_000,
        }
    }

    #[test]
    fn a_signed_link_verifies_until_it_expires() {
        let token = sign(SECRET, &link());
        assert_eq!(verify(SECRET, &token, 1_000), Ok(link()));
        assert_eq!(verify(SECRET, &token, 1_001), Err(LinkError::Expired));
    }

    #[test]
    fn a_changed_field_or_another_secret_is_refused() {
        let token = sign(SECRET, &link());
        let (_, signature) = token.split_once('.').unwrap();
        // The same signature over a link that rejects instead.
        let forged = Link {
            approve: false,
            ..link()
        };
        let fields = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        let forged = format!("{fields}.{signature}");
        assert_eq!(verify(SECRET, &forged, 0), Err(LinkError::Invalid));
        let other = sign("another secret of thirty-two chars", &link());
        assert_eq!(verify(SECRET, &other, 0), Err(LinkError::Invalid));
        for garbage in ["", ".", "abc", "a.b.c", "%%%.%%%"] {
            assert_eq!(verify(SECRET, garbage, 0), Err(LinkError::Invalid));
        }
    }
}
