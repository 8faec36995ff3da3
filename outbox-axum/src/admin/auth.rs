//! Who calls the admin router: the [`AdminAuth`] trait, [`BearerTokens`]
//! and [`LayerAuth`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use http::header::AUTHORIZATION;
use http::request::Parts;
use outbox_core::admin::{Caller, Role};
use subtle::{Choice, ConstantTimeEq};

use crate::Error;

/// The shortest bearer token [`BearerTokens`] accepts, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;

/// Authenticates a request to the admin router: returns its [`Caller`]
/// (identity and role), or `None` to answer `401`.
///
/// A [`Caller`] already in the request's extensions (put there by a layer
/// of yours, e.g. after checking a session or an mTLS certificate) wins:
/// the router then does not call `authenticate` at all.
///
/// ```
/// use outbox_axum::admin::AdminAuth;
/// use outbox_core::admin::Caller;
///
/// /// Trusts a header set by the ingress after single sign-on.
/// struct Ingress;
///
/// impl AdminAuth for Ingress {
///     async fn authenticate(&self, parts: &http::request::Parts) -> Option<Caller> {
///         let user = parts.headers.get("x-forwarded-user")?.to_str().ok()?;
///         Some(Caller::read_only(format!("sso:{user}")))
///     }
/// }
/// ```
pub trait AdminAuth: Send + Sync + 'static {
    /// The caller of the request `parts`, `None` when it is not
    /// authenticated.
    fn authenticate(&self, parts: &Parts) -> impl Future<Output = Option<Caller>> + Send;

    /// Called once by [`build`](super::AdminRouterBuilder::build): an error
    /// refuses to build the router (default: `Ok`).
    ///
    /// # Errors
    /// [`Error::AdminConfig`] saying what to change.
    fn validate(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// [`AdminAuth`] made object safe, for the router's state.
pub(crate) trait ErasedAuth: Send + Sync + 'static {
    fn authenticate<'a>(&'a self, parts: &'a Parts) -> BoxFuture<'a, Option<Caller>>;
}

impl<A: AdminAuth> ErasedAuth for A {
    fn authenticate<'a>(&'a self, parts: &'a Parts) -> BoxFuture<'a, Option<Caller>> {
        Box::pin(AdminAuth::authenticate(self, parts))
    }
}

/// How the router finds the caller of a request without one in its
/// extensions.
#[derive(Clone)]
pub(crate) enum Authenticator {
    /// An [`AdminAuth`].
    Auth(Arc<dyn ErasedAuth>),
    /// [`allow_anonymous`](super::AdminRouterBuilder::allow_anonymous): an
    /// operator named `anonymous`.
    Anonymous,
}

impl Authenticator {
    pub(crate) async fn caller(&self, parts: &Parts) -> Option<Caller> {
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Some(caller.clone());
        }
        match self {
            Authenticator::Auth(auth) => auth.authenticate(parts).await,
            Authenticator::Anonymous => Some(Caller::operator(ANONYMOUS)),
        }
    }
}

/// The identity of every caller when the router is built with
/// [`allow_anonymous`](super::AdminRouterBuilder::allow_anonymous).
pub const ANONYMOUS: &str = "anonymous";

/// Bearer tokens (`Authorization: Bearer <token>`), each with an identity
/// (recorded in the audit trail) and a role.
///
/// A presented token is compared with every configured one in constant
/// time (its length aside: the time depends on the presented token's
/// length, never on a configured token's bytes or length), so response
/// times do not reveal how much of a token was right. Tokens never appear
/// in `Debug` output or logs.
///
/// Tokens are checked when the router is built: an empty one, one shorter
/// than [`MIN_TOKEN_LEN`] bytes, one with whitespace or control characters,
/// or the same token given twice fail
/// [`build`](super::AdminRouterBuilder::build), so nobody ships
/// `changeme`. Generate them with e.g. `openssl rand -hex 32`.
///
/// ```
/// use outbox_axum::admin::BearerTokens;
///
/// let tokens = BearerTokens::new()
///     .operator("admin", "8c1f0e5a9d2b47c6a3e1f9b0d4c7a2e5")
///     .read_only("grafana", "f3a9c2e17b4d4e0a9c6b1d8e2f5a7c30");
/// assert!(!format!("{tokens:?}").contains("8c1f0e5a"));
/// ```
#[derive(Clone, Default)]
pub struct BearerTokens {
    tokens: Vec<Token>,
}

#[derive(Clone)]
struct Token {
    identity: String,
    role: Role,
    secret: Box<[u8]>,
}

impl fmt::Debug for BearerTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Identities and roles only: never the tokens.
        f.debug_map()
            .entries(self.tokens.iter().map(|t| (&t.identity, t.role)))
            .finish()
    }
}

impl BearerTokens {
    /// No tokens yet: add them with [`operator`](Self::operator) and
    /// [`read_only`](Self::read_only).
    pub fn new() -> Self {
        Self::default()
    }

    /// A token whose bearer may act (replay, skip, purge, pause), recorded
    /// in the audit trail as `identity`.
    #[must_use]
    pub fn operator(self, identity: impl Into<String>, token: impl AsRef<[u8]>) -> Self {
        self.with(identity.into(), Role::Operator, token.as_ref())
    }

    /// A token whose bearer may only read (every `GET`).
    #[must_use]
    pub fn read_only(self, identity: impl Into<String>, token: impl AsRef<[u8]>) -> Self {
        self.with(identity.into(), Role::ReadOnly, token.as_ref())
    }

    fn with(mut self, identity: String, role: Role, token: &[u8]) -> Self {
        self.tokens.push(Token {
            identity,
            role,
            secret: token.into(),
        });
        self
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// `true` when no token is configured (every request is answered `401`).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The caller whose token is `presented`, comparing it with every
    /// configured token.
    fn find(&self, presented: &[u8]) -> Option<Caller> {
        let mut found: Option<&Token> = None;
        for token in &self.tokens {
            // No early exit: every token is compared, whatever matched.
            if bool::from(constant_time_eq(presented, &token.secret)) {
                found = Some(token);
            }
        }
        found.map(|t| match t.role {
            Role::Operator => Caller::operator(&t.identity),
            _ => Caller::read_only(&t.identity),
        })
    }
}

/// `presented == secret` in a time that depends only on `presented.len()`.
fn constant_time_eq(presented: &[u8], secret: &[u8]) -> Choice {
    if secret.is_empty() {
        // Refused by `validate`; never equal to anything.
        return Choice::from(0);
    }
    let mut equal = (presented.len() as u64).ct_eq(&(secret.len() as u64));
    for (i, byte) in presented.iter().enumerate() {
        equal &= byte.ct_eq(&secret[i % secret.len()]);
    }
    equal
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is
/// case-insensitive).
fn bearer(parts: &Parts) -> Option<&[u8]> {
    let value = parts.headers.get(AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

impl AdminAuth for BearerTokens {
    async fn authenticate(&self, parts: &Parts) -> Option<Caller> {
        self.find(bearer(parts)?)
    }

    fn validate(&self) -> Result<(), Error> {
        if self.tokens.is_empty() {
            return Err(Error::AdminConfig(
                "BearerTokens has no token: add one with `.operator(identity, token)` or \
                 `.read_only(identity, token)`"
                    .into(),
            ));
        }
        for (i, token) in self.tokens.iter().enumerate() {
            let identity = &token.identity;
            if identity.trim().is_empty() {
                return Err(Error::AdminConfig(
                    "a bearer token has an empty identity: name it (the audit trail records it)"
                        .into(),
                ));
            }
            if token.secret.is_empty() {
                return Err(Error::AdminConfig(format!(
                    "the bearer token of {identity:?} is empty (is its environment variable \
                     set?)"
                )));
            }
            if token.secret.len() < MIN_TOKEN_LEN {
                return Err(Error::AdminConfig(format!(
                    "the bearer token of {identity:?} has {} bytes, fewer than {MIN_TOKEN_LEN}: \
                     use a random one, e.g. `openssl rand -hex 32`",
                    token.secret.len()
                )));
            }
            if token
                .secret
                .iter()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                return Err(Error::AdminConfig(format!(
                    "the bearer token of {identity:?} contains whitespace or control \
                     characters, which an `Authorization` header cannot carry"
                )));
            }
            if let Some(other) = self.tokens[..i]
                .iter()
                .find(|other| bool::from(other.secret.ct_eq(&token.secret)))
            {
                return Err(Error::AdminConfig(format!(
                    "{:?} and {identity:?} have the same bearer token: give each identity its \
                     own, so the audit trail says who acted",
                    other.identity
                )));
            }
        }
        Ok(())
    }
}

/// Authentication by a layer of yours: it inserts a [`Caller`] into the
/// request's extensions (`request.extensions_mut().insert(caller)`);
/// requests without one are answered `401`.
///
/// If that layer authenticates with cookies, protect the router against
/// cross-site requests too: `POST /relays/{name}/pause` has no body, so a
/// browser can send it from any page.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayerAuth;

impl AdminAuth for LayerAuth {
    async fn authenticate(&self, _parts: &Parts) -> Option<Caller> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(authorization: Option<&str>) -> Parts {
        let mut request = http::Request::builder();
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        match request.body(()) {
            Ok(request) => request.into_parts().0,
            Err(e) => panic!("{e}"),
        }
    }

    const OP: &str = "0123456789abcdef-op";
    const RO: &str = "0123456789abcdef-ro";

    #[test]
    fn a_token_is_found_only_whole_and_only_with_the_bearer_scheme() {
        let tokens = BearerTokens::new()
            .operator("alice", OP)
            .read_only("grafana", RO);
        assert!(tokens.validate().is_ok());
        assert_eq!(tokens.find(OP.as_bytes()), Some(Caller::operator("alice")));
        assert_eq!(
            tokens.find(RO.as_bytes()),
            Some(Caller::read_only("grafana"))
        );
        for wrong in ["", "0123456789abcdef", "0123456789abcdef-op-", "x"] {
            assert_eq!(tokens.find(wrong.as_bytes()), None, "{wrong:?}");
        }
        assert_eq!(
            bearer(&parts(Some(&format!("bearer {OP}")))),
            Some(OP.as_bytes())
        );
        assert_eq!(bearer(&parts(Some(&format!("Basic {OP}")))), None);
        assert_eq!(bearer(&parts(Some("Bearer "))), None);
        assert_eq!(bearer(&parts(None)), None);
    }

    #[test]
    fn short_empty_shared_and_missing_tokens_are_refused() {
        let refused = |tokens: BearerTokens, needle: &str| {
            let err = tokens.validate().err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(needle)),
                "{err:?} should mention {needle:?}"
            );
        };
        refused(BearerTokens::new(), "no token");
        refused(BearerTokens::new().operator("a", ""), "empty");
        refused(
            BearerTokens::new().operator("a", "changeme"),
            "fewer than 16",
        );
        refused(
            BearerTokens::new().operator("a", "0123456789 abcdef"),
            "whitespace",
        );
        refused(
            BearerTokens::new().operator("a", OP).read_only("b", OP),
            "same bearer token",
        );
        refused(BearerTokens::new().operator(" ", OP), "empty identity");
    }

    #[test]
    fn debug_shows_identities_never_tokens() {
        let shown = format!("{:?}", BearerTokens::new().operator("alice", OP));
        assert!(shown.contains("alice"), "{shown}");
        assert!(!shown.contains("0123456789"), "{shown}");
    }
}
