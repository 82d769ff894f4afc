//! Who a request is: its bearer key, compared in constant time, as an
//! account (or the operator).

use super::*;

/// The account a request was authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountId(pub String);

/// Whom a request's API key belongs to, within its account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyHolder {
    /// An account-wide key: a service, which names the person it acts for.
    Service,
    /// A user's key (`[[accounts.users]]`): it acts as that person only.
    Person(String),
}

impl KeyHolder {
    /// The person a request acts as: the key's own person, or the one a
    /// service names in `field`. A user's key naming someone else is
    /// refused: a decision through it is its person's and nobody else's.
    pub(crate) fn acting_as(&self, named: Option<String>, field: &str) -> Result<String, Problem> {
        match (self, named) {
            (KeyHolder::Person(person), None) => Ok(person.clone()),
            (KeyHolder::Person(person), Some(named)) if named.eq_ignore_ascii_case(person) => {
                Ok(person.clone())
            }
            (KeyHolder::Person(person), Some(named)) => Err(Problem::new(
                StatusCode::FORBIDDEN,
                "not_this_person",
                &format!(
                    "this API key is {person}'s: it acts as them, not as `{named}` (leave out `{field}`)"
                ),
            )),
            // A blank name is no person (regression: `"approver": ""`
            // decided a gate, recorded as by nobody).
            (KeyHolder::Service, Some(named)) if !named.trim().is_empty() => Ok(named),
            (KeyHolder::Service, _) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "no_person",
                &format!(
                    "name the person in `{field}`: this API key is the account's, not a person's"
                ),
            )),
        }
    }
}

/// The credentials of `Authorization: Bearer TOKEN`. The scheme's name is
/// case-insensitive (RFC 9110, section 11.1), so `bearer` and `BEARER` are
/// the same scheme; spaces around the token are not part of it.
pub(super) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Finds the request's account from `Authorization: Bearer KEY`.
pub(super) async fn authenticate(
    State(daemon): State<Arc<Daemon>>,
    mut request: Request,
    next: Next,
) -> Response {
    // Two keys are no answer as to whom a request is: the first one won,
    // and a proxy that adds its own header decided which account acted
    // (an audit).
    if request
        .headers()
        .get_all(header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
    {
        return problem(
            StatusCode::BAD_REQUEST,
            "several_credentials",
            "send one `Authorization` header: this request has several",
        );
    }
    let Some(key) = bearer_token(request.headers()) else {
        return problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send an API key as `Authorization: Bearer KEY`",
        );
    };
    let Some((account, holder)) = daemon.keys.get(&key_digest(key)) else {
        return problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "this API key belongs to no account",
        );
    };
    request.extensions_mut().insert(account.clone());
    request.extensions_mut().insert(holder.clone());
    next.run(request).await
}

/// An API key as the daemon looks it up: its SHA-256, so that the lookup's
/// timing says nothing about the keys themselves.
pub(super) fn key_digest(key: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes()).into()
}

/// Whether `sent` is `secret`, compared in constant time (both hashed
/// first, so that neither length nor content leaks through timing).
pub(super) fn same_secret(sent: &str, secret: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (
        Sha256::digest(sent.as_bytes()),
        Sha256::digest(secret.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}
