//! Reading and validating the derive's attributes: `#[domain_event(...)]` on the
//! type or a variant, and the `#[aggregate_id]` / `#[aggregate_version]` field
//! markers.
//!
//! Every mistake is recorded in the [`Ctxt`] at the offending token and parsing
//! goes on, so one compile shows all of them. A value that was present but
//! invalid is left out of the result (its [`Attr::key`] is still set, so no
//! "missing" error follows the "invalid" one).
//!
//! The field markers are read in `attr/field.rs`.

mod field;

use proc_macro2::{Span, TokenTree};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, ExprUnary, Lit, LitStr, Meta, UnOp};

use crate::case::{describe_char, first_invalid_char};
use crate::ctxt::Ctxt;

pub(crate) use field::{FieldMarks, MarkedField, parse_field_marks, reject_field_marks};

/// The container attribute, also allowed on enum variants.
const DOMAIN_EVENT: &str = "domain_event";

/// Where a `#[domain_event(...)]` attribute was written; decides which keys it
/// accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// On a struct (or a union, which is rejected later).
    Struct,
    /// On an enum.
    Enum,
    /// On one variant of an enum.
    Variant,
}

impl Place {
    /// The keys `#[domain_event(...)]` accepts here.
    fn keys(self) -> &'static [Key] {
        match self {
            Place::Struct => &[Key::Aggregate, Key::EventType, Key::Version, Key::Crate],
            Place::Enum => &[Key::Aggregate, Key::Version, Key::Crate],
            Place::Variant => &[Key::EventType, Key::Version],
        }
    }
}

/// A key of `#[domain_event(...)]`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Aggregate,
    EventType,
    Version,
    Crate,
}

impl Key {
    const ALL: [Key; 4] = [Key::Aggregate, Key::EventType, Key::Version, Key::Crate];

    fn name(self) -> &'static str {
        match self {
            Key::Aggregate => "aggregate",
            Key::EventType => "event_type",
            Key::Version => "version",
            Key::Crate => "crate",
        }
    }

    /// The key with an example value, as shown in error messages.
    fn example(self) -> &'static str {
        match self {
            Key::Aggregate => "aggregate = \"order\"",
            Key::EventType => "event_type = \"order.placed\"",
            Key::Version => "version = 2",
            Key::Crate => "crate = \"outbox\"",
        }
    }

    /// Why the key is not accepted where it was written: `event_type` is only
    /// refused on an enum, the other keys only on a variant.
    fn misplaced(self) -> String {
        match self {
            Key::EventType => "`event_type` cannot be set on an enum: each variant is its own \
                 event type; put `#[domain_event(event_type = \"...\")]` on the variant instead"
                .to_owned(),
            key => format!(
                "`{}` cannot be set on a variant: set it once for the whole enum, in \
                 `#[domain_event(...)]` on the enum",
                key.name()
            ),
        }
    }
}

/// One key's value, with where the key was first written.
pub(crate) struct Attr<T> {
    /// Span of the key's first occurrence, if it was written at all.
    pub(crate) key: Option<Span>,
    /// The value, if it was written and valid.
    pub(crate) value: Option<T>,
}

impl<T> Default for Attr<T> {
    fn default() -> Self {
        Self {
            key: None,
            value: None,
        }
    }
}

/// A validated `aggregate` or `event_type` string and where it was written.
pub(crate) struct Name {
    /// The string's value.
    pub(crate) value: String,
    /// The span of the string literal.
    pub(crate) span: Span,
}

/// Everything the `#[domain_event(...)]` attributes at one place say.
#[derive(Default)]
pub(crate) struct EventAttrs {
    /// `aggregate = "..."`.
    pub(crate) aggregate: Attr<Name>,
    /// `event_type = "..."`.
    pub(crate) event_type: Attr<Name>,
    /// `version = N`.
    pub(crate) version: Attr<i32>,
    /// `crate = "path"`.
    pub(crate) krate: Attr<syn::Path>,
}

/// Reads every `#[domain_event(...)]` among `attrs` (several are merged, a key
/// may still appear only once in total).
pub(crate) fn parse_event_attrs(cx: &mut Ctxt, attrs: &[Attribute], place: Place) -> EventAttrs {
    let mut out = EventAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident(DOMAIN_EVENT)) {
        if !matches!(attr.meta, Meta::List(_)) {
            let example = match place {
                Place::Variant => Key::EventType.example(),
                Place::Struct | Place::Enum => Key::Aggregate.example(),
            };
            cx.error_spanned_by(
                attr,
                format!("expected `#[domain_event(...)]` with arguments, e.g. `#[domain_event({example})]`"),
            );
            continue;
        }
        let result = attr.parse_nested_meta(|meta| parse_key(cx, &mut out, place, &meta));
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    out
}

/// Reads one `key = value` of `#[domain_event(...)]`.
fn parse_key(
    cx: &mut Ctxt,
    out: &mut EventAttrs,
    place: Place,
    meta: &ParseNestedMeta<'_>,
) -> syn::Result<()> {
    let Some(key) = Key::ALL.into_iter().find(|k| meta.path.is_ident(k.name())) else {
        let expected: Vec<String> = place
            .keys()
            .iter()
            .map(|k| format!("`{}`", k.name()))
            .collect();
        cx.error_spanned_by(
            &meta.path,
            format!(
                "unknown key `{}` in `#[domain_event(...)]`; expected one of: {}",
                meta.path.to_token_stream().to_string().replace(' ', ""),
                expected.join(", "),
            ),
        );
        return skip_value(meta);
    };
    if !place.keys().contains(&key) {
        cx.error_spanned_by(&meta.path, key.misplaced());
        return skip_value(meta);
    }
    let seen = match key {
        Key::Aggregate => out.aggregate.key,
        Key::EventType => out.event_type.key,
        Key::Version => out.version.key,
        Key::Crate => out.krate.key,
    };
    if seen.is_some() {
        cx.error_spanned_by(
            &meta.path,
            format!(
                "duplicate key `{}` in `#[domain_event(...)]`: give it only once",
                key.name()
            ),
        );
        return skip_value(meta);
    }
    let key_span = meta.path.span();
    let value = if meta.input.peek(syn::Token![=]) {
        Some(meta.value()?.parse::<Expr>()?)
    } else {
        cx.error_spanned_by(
            &meta.path,
            format!("`{}` needs a value: write `{}`", key.name(), key.example()),
        );
        skip_value(meta)?;
        None
    };
    match key {
        Key::Aggregate => {
            out.aggregate.key = Some(key_span);
            out.aggregate.value = value.and_then(|v| name_value(cx, key, &v));
        }
        Key::EventType => {
            out.event_type.key = Some(key_span);
            out.event_type.value = value.and_then(|v| name_value(cx, key, &v));
        }
        Key::Version => {
            out.version.key = Some(key_span);
            out.version.value = value.and_then(|v| version_value(cx, &v));
        }
        Key::Crate => {
            out.krate.key = Some(key_span);
            out.krate.value = value.and_then(|v| crate_value(cx, &v));
        }
    }
    Ok(())
}

/// Consumes whatever follows a key that is being rejected (`= expr` or `(...)`),
/// so parsing can go on with the next key.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.input.parse::<TokenTree>()?;
    }
    Ok(())
}

/// The expression inside invisible groups (which `macro_rules!` fragments
/// produce).
fn peel(mut expr: &Expr) -> &Expr {
    while let Expr::Group(group) = expr {
        expr = &group.expr;
    }
    expr
}

/// A string literal value.
fn string_value(cx: &mut Ctxt, key: Key, expr: &Expr) -> Option<LitStr> {
    match peel(expr) {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit.clone()),
        other => {
            cx.error_spanned_by(
                other,
                format!(
                    "`{}` must be a string literal, e.g. `{}`",
                    key.name(),
                    key.example()
                ),
            );
            None
        }
    }
}

/// The longest `aggregate` or `event_type`, in bytes: an AMQP short string
/// (`outbox_core::EventEnvelope::MAX_SHORT_BYTES`).
const MAX_NAME_BYTES: usize = 255;

/// An `aggregate` or `event_type` value: a non-empty string of ASCII letters,
/// digits, `_`, `.` and `-`, at most 255 bytes.
fn name_value(cx: &mut Ctxt, key: Key, expr: &Expr) -> Option<Name> {
    let lit = string_value(cx, key, expr)?;
    let value = lit.value();
    if value.is_empty() {
        cx.error_spanned_by(
            &lit,
            format!(
                "`{}` must not be empty: give a name, e.g. `{}`",
                key.name(),
                key.example()
            ),
        );
        return None;
    }
    if value.len() > MAX_NAME_BYTES {
        cx.error_spanned_by(
            &lit,
            format!(
                "`{}` is {} bytes long: at most {MAX_NAME_BYTES} are allowed (it travels as an AMQP \
                 short string), e.g. `{}`",
                key.name(),
                value.len(),
                key.example()
            ),
        );
        return None;
    }
    if let Some(c) = first_invalid_char(&value) {
        cx.error_spanned_by(
            &lit,
            format!(
                "`{}` \"{}\" contains {}: use only ASCII letters, digits, `_`, `.` and `-`, \
                 e.g. `{}`",
                key.name(),
                value.escape_debug(),
                describe_char(c),
                key.example()
            ),
        );
        return None;
    }
    Some(Name {
        value,
        span: lit.span(),
    })
}

/// A `version` value: an integer literal from 1 to `i32::MAX`.
fn version_value(cx: &mut Ctxt, expr: &Expr) -> Option<i32> {
    const TOO_SMALL: &str = "`version` must be at least 1: schema versions start at 1";
    match peel(expr) {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => match int.base10_parse::<u64>() {
            Ok(0) => {
                cx.error_spanned_by(int, TOO_SMALL);
                None
            }
            Ok(version) => match i32::try_from(version) {
                Ok(version) => Some(version),
                Err(_) => {
                    cx.error_spanned_by(int, too_large());
                    None
                }
            },
            Err(_) => {
                cx.error_spanned_by(int, too_large());
                None
            }
        },
        negative @ Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => {
            cx.error_spanned_by(negative, TOO_SMALL);
            None
        }
        other => {
            cx.error_spanned_by(
                other,
                format!(
                    "`version` must be an integer literal, e.g. `{}`",
                    Key::Version.example()
                ),
            );
            None
        }
    }
}

/// The error for a `version` that does not fit the trait's `i32`.
fn too_large() -> String {
    format!("`version` must fit in an i32: at most {}", i32::MAX)
}

/// A `crate` value: a string holding a path without generic arguments.
fn crate_value(cx: &mut Ctxt, expr: &Expr) -> Option<syn::Path> {
    let lit = string_value(cx, Key::Crate, expr)?;
    match lit.parse_with(syn::Path::parse_mod_style) {
        Ok(path) => Some(path),
        Err(_) => {
            cx.error_spanned_by(
                &lit,
                "`crate` must be the path of the outbox crate, e.g. `crate = \"outbox\"` or \
                 `crate = \"::my_app::outbox\"`",
            );
            None
        }
    }
}
