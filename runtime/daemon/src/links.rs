//! Approval links: what an approver follows from an email to approve or
//! reject one gate.
//!
//! A link is `{public_url}/approvals/{token}`, the token being the link's
//! fields (account, run, step path, approver, decision, expiry, key id) and
//! their HMAC-SHA256 under the account's own key. It is
//! * bound: changing any field breaks the signature, so a link decides that
//!   gate of that account's run, as that approver, that way, and nothing
//!   else;
//! * expiring: at the gate's own expiry, and at most `LIFETIME` after it
//!   was sent;
//! * single use: a decision applies only to a pending gate (the store's
//!   rule), so once any decision is taken every link to the gate only says
//!   so; and only to the asking it was sent for (the gate's record's start),
//!   so that a gate asked again after a redrive is not decided by the links
//!   of its earlier decision.
//!
//! Each account's key is derived from the configured `link_secret` and the
//! account's id, so that no two accounts' links share a key. The token names
//! the secret it was signed under (`k`, a digest of it): an operator rotates
//! the secret by moving the old one to `previous_link_secrets`, and the
//! links already sent keep working until they expire.
//!
//! Following a link only shows what it would do: mail scanners fetch links,
//! so the decision needs the confirmation page's POST.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The longest a link stays valid, for a gate that does not expire sooner.
pub const LIFETIME: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Seconds since the Unix epoch, as links count expiry.
pub fn now_s() -> u64 {
    flow_runtime::time::now_ms() / 1000
}

/// What a link does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// The account whose run it decides; its key signs the link.
    #[serde(rename = "c")]
    pub account: String,
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
    /// When the gate's pending record was made (its `started_ms`): the
    /// asking the link answers. Absent from links sent before it was kept.
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub asked_ms: Option<u64>,
}

/// The fields as signed: the link and the id of the secret behind its key.
#[derive(Serialize, Deserialize)]
struct Signed {
    #[serde(flatten)]
    link: Link,
    #[serde(rename = "k")]
    key_id: String,
}

/// Why a token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// Not a token this flowd signed (mangled, forged, another secret).
    Invalid,
    Expired,
}

/// The secrets links are signed with: the current one signs, and the
/// current and previous ones verify.
#[derive(Clone)]
pub struct LinkKeys {
    secrets: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for LinkKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.secrets.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("LinkKeys").field("key_ids", &ids).finish()
    }
}

impl LinkKeys {
    /// `current` signs; `previous` still verify the links signed with them.
    pub fn new(current: &str, previous: &[String]) -> LinkKeys {
        let secrets = std::iter::once(current)
            .chain(previous.iter().map(String::as_str))
            .map(|secret| (key_id(secret), secret.as_bytes().to_vec()))
            .collect();
        LinkKeys { secrets }
    }

    /// The key of `account`'s links under the secret `key_id` names.
    fn mac(&self, key_id: &str, account: &str) -> Option<Hmac<Sha256>> {
        let (_, secret) = self.secrets.iter().find(|(id, _)| id == key_id)?;
        let mut derive =
            Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
        derive.update(b"flow approval links\0");
        derive.update(account.as_bytes());
        let key = derive.finalize().into_bytes();
        Some(Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes keys of any length"))
    }

    /// A tag of `account`'s `what` that says nothing of it to whoever gets
    /// it but is the same for it in every flowd sharing the current secret:
    /// 16 hex digits of its MAC. For a number that counts every account's
    /// rows, which a receiver would read other tenants' activity in.
    pub fn tag(&self, account: &str, what: &str) -> String {
        let key_id = self.secrets[0].0.clone();
        let mut mac = self
            .mac(&key_id, account)
            .expect("the current secret is known");
        mac.update(b"tag\0");
        mac.update(what.as_bytes());
        mac.finalize().into_bytes()[..8]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// The number an API client sees for `account`'s row `row` of a table
    /// that counts every account's rows (notifications): a permutation of
    /// the numbers below 2^52 under the account's key, so that the numbers
    /// one account sees say nothing of how many rows the others made, and
    /// stay exact in JavaScript's numbers. `row_of` turns it back. Under
    /// another current secret (a rotation) the numbers are others.
    pub fn disguise(&self, account: &str, row: i64) -> i64 {
        let row = u64::try_from(row).unwrap_or(0);
        // The store's row ids stay far below 2^52 (4.5 × 10^15).
        debug_assert!(row < 1 << DISGUISED_BITS, "row {row}");
        self.permute(account, row & DISGUISED_MASK, false) as i64
    }

    /// The row that `disguise` turned into `number` for `account`; `None`
    /// for a number no row of a table below 2^52 rows gives.
    pub fn row_of(&self, account: &str, number: i64) -> Option<i64> {
        let number = u64::try_from(number)
            .ok()
            .filter(|n| *n <= DISGUISED_MASK)?;
        i64::try_from(self.permute(account, number, true)).ok()
    }

    /// A four-round Feistel network over two halves of `DISGUISED_BITS`,
    /// each round's function a MAC of the other half: a permutation of
    /// the numbers below 2^52 that only the key's holder can invert.
    fn permute(&self, account: &str, number: u64, backwards: bool) -> u64 {
        const HALF: u32 = DISGUISED_BITS / 2;
        const HALF_MASK: u64 = (1 << HALF) - 1;
        let key_id = self.secrets[0].0.clone();
        let mut keyed = self
            .mac(&key_id, account)
            .expect("the current secret is known");
        keyed.update(b"number\0");
        let round = |index: u8, half: u64| {
            let mut mac = keyed.clone();
            mac.update(&[index]);
            mac.update(&half.to_le_bytes());
            let bytes = mac.finalize().into_bytes();
            u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) & HALF_MASK
        };
        let (mut left, mut right) = (number >> HALF, number & HALF_MASK);
        if backwards {
            for index in (0..4).rev() {
                (left, right) = (right ^ round(index, left), left);
            }
        } else {
            for index in 0..4 {
                (left, right) = (right, left ^ round(index, right));
            }
        }
        (left << HALF) | right
    }

    /// The token of `link`, signed with its account's key under the current
    /// secret.
    pub fn sign(&self, link: &Link) -> String {
        let key_id = self.secrets[0].0.clone();
        let fields = serde_json::to_vec(&Signed {
            link: link.clone(),
            key_id: key_id.clone(),
        })
        .expect("a link serializes");
        let mut mac = self
            .mac(&key_id, &link.account)
            .expect("the current secret is known");
        mac.update(&fields);
        let signature = mac.finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&fields),
            URL_SAFE_NO_PAD.encode(signature)
        )
    }

    /// The link `token` stands for, if one of these secrets signed it with
    /// its account's key and it has not expired at `now_s`.
    pub fn verify(&self, token: &str, now_s: u64) -> Result<Link, LinkError> {
        let (fields, signature) = token.split_once('.').ok_or(LinkError::Invalid)?;
        let fields = URL_SAFE_NO_PAD
            .decode(fields)
            .map_err(|_| LinkError::Invalid)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| LinkError::Invalid)?;
        // Read before the signature is checked, to know which key checks it;
        // nothing of it is used unless the signature holds.
        let signed: Signed = serde_json::from_slice(&fields).map_err(|_| LinkError::Invalid)?;
        let mut mac = self
            .mac(&signed.key_id, &signed.link.account)
            .ok_or(LinkError::Invalid)?;
        mac.update(&fields);
        // Compared in constant time.
        mac.verify_slice(&signature)
            .map_err(|_| LinkError::Invalid)?;
        if now_s > signed.link.expires_s {
            return Err(LinkError::Expired);
        }
        Ok(signed.link)
    }
}

/// How many bits a disguised number has (`LinkKeys::disguise`): an even
/// number, and at most 53 so that JavaScript's numbers hold it exactly.
const DISGUISED_BITS: u32 = 52;
const DISGUISED_MASK: u64 = (1 << DISGUISED_BITS) - 1;

/// A secret's id in tokens: the start of its SHA-256, which names it without
/// telling it.
fn key_id(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    /// A disguised number turns back into its row, is another number for
    /// another account, and neighbouring rows are not neighbouring numbers
    /// (notification ids counted every account's rows: an audit).
    #[test]
    fn a_disguised_row_turns_back_and_says_nothing() {
        let keys = LinkKeys::new(SECRET, &[]);
        let mut seen = std::collections::HashSet::new();
        for row in (1..2_000).chain([1 << 40, (1 << 52) - 1]) {
            let number = keys.disguise("acme", row);
            assert!((0..1 << 52).contains(&number), "{row} → {number}");
            assert_eq!(keys.row_of("acme", number), Some(row));
            assert!(seen.insert(number), "{row} → {number} twice");
            assert_ne!(keys.disguise("globex", row), number, "{row}");
        }
        let (one, two) = (keys.disguise("acme", 41), keys.disguise("acme", 42));
        assert!(one.abs_diff(two) > 1_000, "{one} {two}");
        assert_eq!(keys.row_of("acme", -1), None);
        assert_eq!(keys.row_of("acme", 1 << 52), None);
    }

    /// A tag is the same for one account's `what` in every flowd of the
    /// secret, and tells nothing of it (an audit read other tenants' events
    /// in a delivery id's outbox row number).
    #[test]
    fn a_tag_is_stable_and_says_nothing() {
        let keys = LinkKeys::new(SECRET, &[]);
        let tag = keys.tag("acme", "event 28");
        assert_eq!(tag.len(), 16);
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()), "{tag}");
        assert_eq!(LinkKeys::new(SECRET, &[]).tag("acme", "event 28"), tag);
        assert_ne!(keys.tag("acme", "event 29"), tag);
        assert_ne!(keys.tag("globex", "event 28"), tag);
        let other = "fedcba9876543210fedcba9876543210";
        assert_ne!(LinkKeys::new(other, &[]).tag("acme", "event 28"), tag);
    }

    fn link() -> Link {
        Link {
            account: "acme".into(),
            run_id: "r1".into(),
            path: "gates/legal".into(),
            approver: "ana@x.io".into(),
            approve: true,
            expires_s: 1_000,
            asked_ms: Some(5),
        }
    }

    fn keys() -> LinkKeys {
        LinkKeys::new(SECRET, &[])
    }

    #[test]
    fn a_signed_link_verifies_until_it_expires() {
        let token = keys().sign(&link());
        assert_eq!(keys().verify(&token, 1_000), Ok(link()));
        assert_eq!(keys().verify(&token, 1_001), Err(LinkError::Expired));
    }

    #[test]
    fn a_changed_field_or_another_secret_is_refused() {
        let token = keys().sign(&link());
        let (fields, signature) = token.split_once('.').unwrap();
        let signed: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(fields).unwrap()).unwrap();
        // The same signature over a link that rejects instead, or over the
        // same link for another account.
        for (field, value) in [("y", json!(false)), ("c", json!("globex"))] {
            let mut forged = signed.clone();
            forged[field] = value;
            let fields = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
            let forged = format!("{fields}.{signature}");
            assert_eq!(
                keys().verify(&forged, 0),
                Err(LinkError::Invalid),
                "{field}"
            );
        }
        let other = LinkKeys::new("another secret of thirty-two chars", &[]).sign(&link());
        assert_eq!(keys().verify(&other, 0), Err(LinkError::Invalid));
        for garbage in ["", ".", "abc", "a.b.c", "%%%.%%%"] {
            assert_eq!(keys().verify(garbage, 0), Err(LinkError::Invalid));
        }
    }

    /// Each account's links have their own key: the signature of one
    /// account's link does not sign the same fields for another.
    #[test]
    fn accounts_sign_with_keys_of_their_own() {
        let keys = keys();
        let acme = keys.mac(&key_id(SECRET), "acme").unwrap().finalize();
        let globex = keys.mac(&key_id(SECRET), "globex").unwrap().finalize();
        assert_ne!(acme.into_bytes(), globex.into_bytes());
    }

    /// Rotating the secret: links signed with the old one keep working
    /// while it is listed as previous, and stop when it is dropped.
    #[test]
    fn a_rotated_secret_keeps_the_links_already_sent() {
        let old = keys().sign(&link());
        let rotated = LinkKeys::new("a brand new secret of 32 characters", &[SECRET.to_string()]);
        assert_eq!(rotated.verify(&old, 0), Ok(link()));
        let new = rotated.sign(&link());
        assert_ne!(new, old);
        assert_eq!(rotated.verify(&new, 0), Ok(link()));
        let dropped = LinkKeys::new("a brand new secret of 32 characters", &[]);
        assert_eq!(dropped.verify(&old, 0), Err(LinkError::Invalid));
    }

    use serde_json::json;
}
