//! The validated description of a `#[derive(DomainEvent)]` input: what the
//! generated code needs, with every rule checked.

use std::collections::HashMap;

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Fields, Generics, Ident};

use crate::attr::{self, EventAttrs, FieldMarks, MarkedField, Name, Place};
use crate::case::{default_event_type, describe_char, first_invalid_char};
use crate::crate_path;
use crate::ctxt::Ctxt;

/// A type that derives `DomainEvent`.
pub(crate) struct Model<'a> {
    /// The type's name.
    pub(crate) ident: &'a Ident,
    /// The type's generics, used unchanged for the impls.
    pub(crate) generics: &'a Generics,
    /// Path of the crate that exports the `DomainEvent` trait.
    pub(crate) krate: syn::Path,
    /// The aggregate type.
    pub(crate) aggregate: String,
    /// What kind of type it is.
    pub(crate) body: Body<'a>,
}

/// A struct is one event type; an enum has one per variant.
pub(crate) enum Body<'a> {
    /// A struct with named or positional fields.
    Struct(Event<'a>),
    /// An enum, in declaration order of its variants.
    Enum(Vec<Variant<'a>>),
}

/// One variant of an enum.
pub(crate) struct Variant<'a> {
    /// The variant's name.
    pub(crate) ident: &'a Ident,
    /// The event the variant is.
    pub(crate) event: Event<'a>,
}

/// One event type: a struct, or one variant of an enum.
pub(crate) struct Event<'a> {
    /// The event type string.
    pub(crate) event_type: String,
    /// The payload schema version.
    pub(crate) version: i32,
    /// The `#[aggregate_id]` field.
    pub(crate) id: MarkedField<'a>,
    /// The `#[aggregate_version]` field, if any.
    pub(crate) aggregate_version: Option<MarkedField<'a>>,
}

/// Schema version when none is given.
const DEFAULT_VERSION: i32 = 1;

impl<'a> Model<'a> {
    /// Reads and validates `input`, reporting every mistake at once.
    pub(crate) fn from_input(input: &'a DeriveInput) -> syn::Result<Self> {
        let mut cx = Ctxt::new();
        let ident = &input.ident;
        let (place, noun) = match &input.data {
            Data::Struct(_) => (Place::Struct, "the struct"),
            Data::Enum(_) => (Place::Enum, "the enum"),
            Data::Union(_) => (Place::Struct, "the union"),
        };
        let attrs = attr::parse_event_attrs(&mut cx, &input.attrs, place);
        attr::reject_field_marks(&mut cx, &input.attrs, noun);
        if attrs.aggregate.key.is_none() {
            cx.error_spanned_by(
                ident,
                format!(
                    "missing `aggregate`: add `#[domain_event(aggregate = \"...\")]` to `{ident}`, \
                     naming the aggregate the event belongs to, e.g. \
                     `#[domain_event(aggregate = \"order\")]`"
                ),
            );
        }
        let aggregate = attrs
            .aggregate
            .value
            .as_ref()
            .map(|name| name.value.as_str());

        let body = match &input.data {
            Data::Struct(data) => {
                if matches!(data.fields, Fields::Unit) {
                    cx.error_spanned_by(
                        ident,
                        format!(
                            "`DomainEvent` cannot be derived for the unit struct `{ident}`: an \
                             event needs a field marked `#[aggregate_id]`, e.g. \
                             `struct {ident} {{ #[aggregate_id] id: u64 }}`"
                        ),
                    );
                    None
                } else {
                    let marks = attr::parse_field_marks(&mut cx, &data.fields);
                    let missing = format!(
                        "missing `#[aggregate_id]` field: mark the field of `{ident}` that \
                         identifies the aggregate with `#[aggregate_id]`"
                    );
                    let spec = EventSpec {
                        ident,
                        attrs: &attrs,
                        default_version: DEFAULT_VERSION,
                        missing_id: &missing,
                    };
                    event(&mut cx, aggregate, spec, marks).map(Body::Struct)
                }
            }
            Data::Enum(data) => {
                if data.variants.is_empty() {
                    cx.error_spanned_by(
                        ident,
                        format!(
                            "`DomainEvent` cannot be derived for the empty enum `{ident}`: add \
                             one variant per event type"
                        ),
                    );
                }
                let default_version = attrs.version.value.unwrap_or(DEFAULT_VERSION);
                let mut variants = Vec::with_capacity(data.variants.len());
                let mut seen: HashMap<String, &Ident> = HashMap::new();
                for variant in &data.variants {
                    let v_ident = &variant.ident;
                    let v_attrs = attr::parse_event_attrs(&mut cx, &variant.attrs, Place::Variant);
                    attr::reject_field_marks(&mut cx, &variant.attrs, "a variant");
                    if matches!(variant.fields, Fields::Unit) {
                        cx.error_spanned_by(
                            v_ident,
                            format!(
                                "unit variant `{v_ident}` cannot be an event: give it a field \
                                 marked `#[aggregate_id]`, e.g. \
                                 `{v_ident} {{ #[aggregate_id] id: u64 }}`"
                            ),
                        );
                        variants.push(None);
                        continue;
                    }
                    let marks = attr::parse_field_marks(&mut cx, &variant.fields);
                    let missing = format!(
                        "variant `{v_ident}` has no `#[aggregate_id]` field: mark the field that \
                         identifies the aggregate with `#[aggregate_id]`"
                    );
                    let spec = EventSpec {
                        ident: v_ident,
                        attrs: &v_attrs,
                        default_version,
                        missing_id: &missing,
                    };
                    let event = event(&mut cx, aggregate, spec, marks);
                    if let Some(event) = &event {
                        match seen.get(&event.event_type) {
                            Some(first) => {
                                let span = v_attrs
                                    .event_type
                                    .value
                                    .as_ref()
                                    .map_or_else(|| v_ident.span(), |name| name.span);
                                cx.error_at(
                                    span,
                                    format!(
                                        "duplicate event type `{}`: variant `{first}` has the \
                                         same one; give one of them its own \
                                         `#[domain_event(event_type = \"...\")]`",
                                        event.event_type
                                    ),
                                );
                            }
                            None => {
                                seen.insert(event.event_type.clone(), v_ident);
                            }
                        }
                    }
                    variants.push(event.map(|event| Variant {
                        ident: v_ident,
                        event,
                    }));
                }
                variants
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .map(Body::Enum)
            }
            Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "`DomainEvent` cannot be derived for a union: use a struct, or an enum with \
                     one variant per event type",
                );
                None
            }
        };

        cx.check()?;
        let (Some(aggregate), Some(body)) = (attrs.aggregate.value, body) else {
            return Err(syn::Error::new(
                Span::call_site(),
                "internal error in `#[derive(DomainEvent)]`: input rejected without a message",
            ));
        };
        let krate = attrs.krate.value.unwrap_or_else(crate_path::resolve);
        Ok(Model {
            ident,
            generics: &input.generics,
            krate,
            aggregate: aggregate.value,
            body,
        })
    }
}

/// What [`event`] needs to know about the struct or variant.
struct EventSpec<'s> {
    /// The struct's or variant's name.
    ident: &'s Ident,
    /// Its `#[domain_event(...)]` attributes.
    attrs: &'s EventAttrs,
    /// Version when the attributes give none.
    default_version: i32,
    /// The error for a missing `#[aggregate_id]`.
    missing_id: &'s str,
}

/// The event type of one struct or variant; `None` after reporting why not.
fn event<'a>(
    cx: &mut Ctxt,
    aggregate: Option<&str>,
    spec: EventSpec<'_>,
    marks: FieldMarks<'a>,
) -> Option<Event<'a>> {
    if marks.id.is_none() {
        cx.error_spanned_by(spec.ident, spec.missing_id);
    }
    let event_type = match &spec.attrs.event_type {
        attr::Attr {
            value: Some(Name { value, .. }),
            ..
        } => Some(value.clone()),
        attr::Attr { key: Some(_), .. } => None,
        attr::Attr { key: None, .. } => aggregate.and_then(|aggregate| {
            let name = default_event_type(aggregate, &spec.ident.unraw().to_string());
            match first_invalid_char(&name) {
                None => Some(name),
                Some(c) => {
                    cx.error_spanned_by(
                        spec.ident,
                        format!(
                            "the default event type \"{}\" contains {}: set one made of ASCII \
                             letters, digits, `_`, `.` and `-` with \
                             `#[domain_event(event_type = \"...\")]`",
                            name.escape_debug(),
                            describe_char(c)
                        ),
                    );
                    None
                }
            }
        }),
    };
    let version = match spec.attrs.version {
        attr::Attr {
            value: Some(version),
            ..
        } => Some(version),
        attr::Attr { key: Some(_), .. } => None,
        attr::Attr { key: None, .. } => Some(spec.default_version),
    };
    Some(Event {
        event_type: event_type?,
        version: version?,
        id: marks.id?,
        aggregate_version: marks.version,
    })
}
