//! Finding the path of the crate that exports the `DomainEvent` trait in the
//! crate being compiled, from its `Cargo.toml` (with `proc-macro-crate`).
//!
//! `outbox` (the facade) is preferred over `outbox-core`; a renamed dependency
//! is found under its new name. When neither is a dependency, `::outbox` is
//! assumed. `#[domain_event(crate = "...")]` bypasses all of this.

use proc_macro_crate::{FoundCrate, crate_name};
use syn::{Ident, parse_quote};

/// The path of the crate exporting `DomainEvent`, e.g. `::outbox`.
pub(crate) fn resolve() -> syn::Path {
    found("outbox", "outbox")
        .or_else(|| found("outbox-core", "outbox_core"))
        .unwrap_or_else(|| parse_quote!(::outbox))
}

/// `::<name>` if `package` is the crate being compiled or one of its
/// dependencies; `itself` is the crate's own name, used for
/// [`FoundCrate::Itself`] (its doctests and examples, which see it as an extern
/// crate).
fn found(package: &str, itself: &str) -> Option<syn::Path> {
    let name = match crate_name(package).ok()? {
        FoundCrate::Itself => itself.to_owned(),
        FoundCrate::Name(name) => name,
    };
    let ident: Ident = syn::parse_str(&name).ok()?;
    Some(parse_quote!(::#ident))
}
