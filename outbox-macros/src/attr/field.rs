//! The field markers `#[aggregate_id]` and `#[aggregate_version]`: found on
//! a struct's or variant's fields, and refused anywhere else.

use syn::{Attribute, Field, Fields, Member, Meta};

use super::DOMAIN_EVENT;
use crate::ctxt::Ctxt;

/// Field marker: the field is the aggregate id.
const AGGREGATE_ID: &str = "aggregate_id";
/// Field marker: the field is the aggregate version.
const AGGREGATE_VERSION: &str = "aggregate_version";

/// A field marked `#[aggregate_id]` or `#[aggregate_version]`.
pub(crate) struct MarkedField<'a> {
    /// How to reach the field: `self.<member>`.
    pub(crate) member: Member,
    /// The field itself.
    pub(crate) field: &'a Field,
}

impl MarkedField<'_> {
    /// The field's name for messages: `order_id`, or `field 0` in a tuple struct.
    fn describe(&self) -> String {
        match &self.member {
            Member::Named(ident) => format!("`{ident}`"),
            Member::Unnamed(index) => format!("field {}", index.index),
        }
    }
}

/// The marked fields of a struct or variant.
pub(crate) struct FieldMarks<'a> {
    /// The `#[aggregate_id]` field (the first, if several were marked).
    pub(crate) id: Option<MarkedField<'a>>,
    /// The `#[aggregate_version]` field (the first, if several were marked).
    pub(crate) version: Option<MarkedField<'a>>,
}

/// Finds the `#[aggregate_id]` and `#[aggregate_version]` fields, reporting
/// markers with arguments, markers given twice, and `#[domain_event]` on a field.
pub(crate) fn parse_field_marks<'a>(cx: &mut Ctxt, fields: &'a Fields) -> FieldMarks<'a> {
    let mut marks = FieldMarks {
        id: None,
        version: None,
    };
    for (index, field) in fields.iter().enumerate() {
        let member = match &field.ident {
            Some(ident) => Member::Named(ident.clone()),
            None => Member::Unnamed(index.into()),
        };
        for attr in &field.attrs {
            let (slot, name, what) = if attr.path().is_ident(AGGREGATE_ID) {
                (&mut marks.id, AGGREGATE_ID, "identifies the aggregate")
            } else if attr.path().is_ident(AGGREGATE_VERSION) {
                (
                    &mut marks.version,
                    AGGREGATE_VERSION,
                    "holds the aggregate version",
                )
            } else {
                if attr.path().is_ident(DOMAIN_EVENT) {
                    cx.error_spanned_by(
                        attr,
                        "`#[domain_event(...)]` is not allowed on a field: put it on the struct, \
                         enum or variant, and mark fields with `#[aggregate_id]` or \
                         `#[aggregate_version]`",
                    );
                }
                continue;
            };
            if !matches!(attr.meta, Meta::Path(_)) {
                cx.error_spanned_by(
                    &attr.meta,
                    format!("`#[{name}]` takes no arguments: write `#[{name}]`"),
                );
            }
            match slot {
                Some(first) => cx.error_spanned_by(
                    attr,
                    format!(
                        "duplicate `#[{name}]`: {} already {what}; mark only one field",
                        first.describe()
                    ),
                ),
                None => {
                    *slot = Some(MarkedField {
                        member: member.clone(),
                        field,
                    });
                }
            }
        }
    }
    marks
}

/// Reports `#[aggregate_id]` / `#[aggregate_version]` written on `what` (the
/// struct, enum or a variant) rather than on a field.
pub(crate) fn reject_field_marks(cx: &mut Ctxt, attrs: &[Attribute], what: &str) {
    for attr in attrs {
        for name in [AGGREGATE_ID, AGGREGATE_VERSION] {
            if attr.path().is_ident(name) {
                cx.error_spanned_by(
                    attr,
                    format!("`#[{name}]` goes on a field, not on {what}: mark the field itself"),
                );
            }
        }
    }
}
