//! Error collection, so that one compile reports every mistake in the input.
//!
//! The same pattern as `serde_derive`'s `Ctxt`: validation code pushes
//! [`syn::Error`]s and keeps going; [`Ctxt::check`] combines them into one error
//! whose `into_compile_error` emits one `compile_error!` per mistake, each at its
//! own span.

use std::fmt::Display;

use quote::ToTokens;

/// Collects the errors found while reading a `#[derive(DomainEvent)]` input.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    /// An empty context.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records an error spanning `tokens` (from their first to their last token).
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&mut self, tokens: T, message: M) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub(crate) fn error_at<M: Display>(&mut self, span: proc_macro2::Span, message: M) {
        self.errors.push(syn::Error::new(span, message));
    }

    /// Records an error produced by `syn` (usually a syntax error in an attribute).
    pub(crate) fn syn_error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// `Ok` if nothing was recorded, otherwise all recorded errors combined into
    /// one, in the order they were recorded.
    pub(crate) fn check(self) -> syn::Result<()> {
        let mut errors = self.errors.into_iter();
        match errors.next() {
            None => Ok(()),
            Some(mut combined) => {
                for error in errors {
                    combined.combine(error);
                }
                Err(combined)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proc_macro2::Span;

    use super::Ctxt;

    #[test]
    fn empty_context_is_ok() {
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    fn errors_are_combined_in_order() {
        let mut cx = Ctxt::new();
        cx.error_at(Span::call_site(), "first");
        cx.error_at(Span::call_site(), "second");
        let messages: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages, ["first", "second"]);
    }
}
