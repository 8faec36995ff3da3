//! Code generation: the `DomainEvent` impl and the inherent constants.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::DeriveInput;
use syn::spanned::Spanned;

use crate::attr::MarkedField;
use crate::model::{Body, Event, Model, Variant};

/// Expands `#[derive(DomainEvent)]` on `input`.
pub(crate) fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let model = Model::from_input(input)?;
    let krate = &model.krate;
    let ident = model.ident;
    let (impl_generics, ty_generics, where_clause) = model.generics.split_for_impl();
    let aggregate = &model.aggregate;

    let (consts, methods) = match &model.body {
        Body::Struct(event) => (struct_consts(aggregate, event), struct_methods(event)),
        Body::Enum(variants) => (enum_consts(aggregate, variants), enum_methods(variants)),
    };

    Ok(quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #ident #ty_generics #where_clause {
                #consts
            }

            #[automatically_derived]
            impl #impl_generics #krate::DomainEvent for #ident #ty_generics #where_clause {
                #[inline]
                fn aggregate_type(&self) -> &'static ::core::primitive::str {
                    Self::AGGREGATE_TYPE
                }

                #methods
            }
        };
    })
}

/// `AGGREGATE_TYPE`, `EVENT_TYPE` and `SCHEMA_VERSION` of a struct.
fn struct_consts(aggregate: &str, event: &Event<'_>) -> TokenStream {
    let Event {
        event_type,
        version,
        ..
    } = event;
    let aggregate_doc = aggregate_doc(aggregate);
    let event_type_doc = format!(
        "The event type, `\"{}\"`: what `DomainEvent::event_type` returns.",
        event_type.escape_default()
    );
    let version_doc = format!(
        "The payload schema version, `{version}`: what `DomainEvent::schema_version` returns."
    );
    quote! {
        #[doc = #aggregate_doc]
        pub const AGGREGATE_TYPE: &'static ::core::primitive::str = #aggregate;
        #[doc = #event_type_doc]
        pub const EVENT_TYPE: &'static ::core::primitive::str = #event_type;
        #[doc = #version_doc]
        pub const SCHEMA_VERSION: ::core::primitive::i32 = #version;
    }
}

/// `AGGREGATE_TYPE` and `EVENT_TYPES` of an enum.
fn enum_consts(aggregate: &str, variants: &[Variant<'_>]) -> TokenStream {
    let aggregate_doc = aggregate_doc(aggregate);
    let event_types = variants.iter().map(|v| &v.event.event_type);
    let listed: Vec<String> = variants
        .iter()
        .map(|v| format!("`\"{}\"`", v.event.event_type.escape_default()))
        .collect();
    let event_types_doc = format!(
        "The event types of all variants, in declaration order: {}.",
        listed.join(", ")
    );
    quote! {
        #[doc = #aggregate_doc]
        pub const AGGREGATE_TYPE: &'static ::core::primitive::str = #aggregate;
        #[doc = #event_types_doc]
        pub const EVENT_TYPES: &'static [&'static ::core::primitive::str] = &[#(#event_types),*];
    }
}

/// The doc of `AGGREGATE_TYPE`.
fn aggregate_doc(aggregate: &str) -> String {
    format!(
        "The aggregate type, `\"{}\"`: what `DomainEvent::aggregate_type` returns.",
        aggregate.escape_default()
    )
}

/// The trait methods of a struct (besides `aggregate_type`).
fn struct_methods(event: &Event<'_>) -> TokenStream {
    let id_member = &event.id.member;
    let id = to_string(&event.id, quote!(&self.#id_member));
    let version = event.aggregate_version.as_ref().map(|field| {
        let member = &field.member;
        let value = into_i64(field, quote!(&self.#member));
        quote! {
            #[inline]
            fn aggregate_version(&self) -> ::core::option::Option<::core::primitive::i64> {
                ::core::option::Option::Some(#value)
            }
        }
    });
    quote! {
        #[inline]
        fn event_type(&self) -> &'static ::core::primitive::str {
            Self::EVENT_TYPE
        }

        #[inline]
        fn schema_version(&self) -> ::core::primitive::i32 {
            Self::SCHEMA_VERSION
        }

        #[inline]
        fn aggregate_id(&self) -> ::std::string::String {
            #id
        }

        #version
    }
}

/// The trait methods of an enum (besides `aggregate_type`): one `match self`
/// each, one arm per variant.
fn enum_methods(variants: &[Variant<'_>]) -> TokenStream {
    let binding = quote!(__outbox_field);
    let event_type_arms = variants.iter().map(|v| {
        let ident = v.ident;
        let event_type = &v.event.event_type;
        quote!(Self::#ident { .. } => #event_type,)
    });
    let version_arms = variants.iter().map(|v| {
        let ident = v.ident;
        let version = v.event.version;
        quote!(Self::#ident { .. } => #version,)
    });
    let id_arms = variants.iter().map(|v| {
        let ident = v.ident;
        let member = &v.event.id.member;
        let id = to_string(&v.event.id, binding.clone());
        quote!(Self::#ident { #member: #binding, .. } => #id,)
    });
    let aggregate_version = variants
        .iter()
        .any(|v| v.event.aggregate_version.is_some())
        .then(|| {
            let arms = variants.iter().map(|v| {
                let ident = v.ident;
                match &v.event.aggregate_version {
                    Some(field) => {
                        let member = &field.member;
                        let value = into_i64(field, binding.clone());
                        quote! {
                            Self::#ident { #member: #binding, .. } => {
                                ::core::option::Option::Some(#value)
                            }
                        }
                    }
                    None => quote!(Self::#ident { .. } => ::core::option::Option::None,),
                }
            });
            quote! {
                #[inline]
                fn aggregate_version(&self) -> ::core::option::Option<::core::primitive::i64> {
                    match self {
                        #(#arms)*
                    }
                }
            }
        });
    quote! {
        #[inline]
        fn event_type(&self) -> &'static ::core::primitive::str {
            match self {
                #(#event_type_arms)*
            }
        }

        #[inline]
        fn schema_version(&self) -> ::core::primitive::i32 {
            match self {
                #(#version_arms)*
            }
        }

        #[inline]
        fn aggregate_id(&self) -> ::std::string::String {
            match self {
                #(#id_arms)*
            }
        }

        #aggregate_version
    }
}

/// `ToString::to_string` of the `#[aggregate_id]` field (`reference` is a
/// reference to it). The trait is named through the field's type, spanned at
/// that type, so a type without `Display` is reported at the field.
fn to_string(field: &MarkedField<'_>, reference: TokenStream) -> TokenStream {
    let ty = &field.field.ty;
    let call = quote_spanned!(ty.span()=> <#ty as ::std::string::ToString>::to_string);
    quote!(#call(#reference))
}

/// `Into::<i64>::into` of a clone of the `#[aggregate_version]` field
/// (`reference` is a reference to it). The trait is named through the field's
/// type, spanned at that type, so a type that does not convert into `i64` is
/// reported at the field.
fn into_i64(field: &MarkedField<'_>, reference: TokenStream) -> TokenStream {
    let ty = &field.field.ty;
    let into = quote_spanned!(ty.span()=>
        <#ty as ::core::convert::Into<::core::primitive::i64>>::into
    );
    let clone = quote_spanned!(ty.span()=> <#ty as ::core::clone::Clone>::clone);
    quote!(#into(#clone(#reference)))
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use super::expand;

    /// The expansion, checked to be valid Rust items.
    fn expanded(input: &syn::DeriveInput) -> String {
        let tokens = expand(input).unwrap();
        syn::parse2::<syn::File>(tokens.clone()).unwrap();
        tokens.to_string()
    }

    #[test]
    fn struct_expansion_uses_the_given_crate_path_and_generics() {
        let out = expanded(&parse_quote! {
            #[domain_event(aggregate = "order", crate = "::my_outbox")]
            struct OrderPlaced<'a, T: Display> {
                #[aggregate_id] order_id: T,
                #[aggregate_version] version: i64,
                note: &'a str,
            }
        });
        assert!(out.contains(
            "impl < 'a , T : Display > :: my_outbox :: DomainEvent for OrderPlaced < 'a , T >"
        ));
        assert!(out.contains(
            "pub const EVENT_TYPE : & 'static :: core :: primitive :: str = \"order.placed\""
        ));
        assert!(out.contains("fn aggregate_version"));
    }

    #[test]
    fn enum_expansion_has_one_arm_per_variant() {
        let out = expanded(&parse_quote! {
            #[domain_event(aggregate = "order", crate = "::outbox")]
            enum OrderEvent {
                Placed { #[aggregate_id] order_id: u64 },
                #[domain_event(event_type = "order.cancelled.v1", version = 2)]
                Cancelled(#[aggregate_id] u64, String),
            }
        });
        assert!(out.contains("Self :: Placed { .. } => \"order.placed\""));
        assert!(out.contains("Self :: Cancelled { .. } => 2i32"));
        assert!(out.contains("Self :: Cancelled { 0 : __outbox_field , .. }"));
        assert!(!out.contains("fn aggregate_version"));
    }

    #[test]
    fn all_mistakes_are_reported_together() {
        let input = parse_quote! {
            #[domain_event(aggregate = "", colour = "red", version = 0)]
            enum OrderEvent {
                Placed { order_id: u64 },
                Cancelled,
            }
        };
        let errors: Vec<String> = expand(&input)
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors.len(), 5, "{errors:#?}");
    }
}
