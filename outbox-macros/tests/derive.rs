//! Behaviour of `#[derive(DomainEvent)]`, through `outbox_core` directly.

use std::fmt::Display;

use outbox_core::DomainEvent as DomainEventTrait;
use outbox_macros::DomainEvent;
use serde::Serialize;
use uuid::Uuid;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id]
    order_id: Uuid,
    customer_id: Uuid,
    total_cents: i64,
}

#[test]
fn struct_defaults() {
    let order_id = Uuid::now_v7();
    let customer_id = Uuid::now_v7();
    let event = OrderPlaced {
        order_id,
        customer_id,
        total_cents: 1250,
    };
    assert_eq!(event.aggregate_type(), "order");
    assert_eq!(event.event_type(), "order.placed");
    assert_eq!(event.schema_version(), 1);
    assert_eq!(event.aggregate_id(), order_id.to_string());
    assert_eq!(event.aggregate_version(), None);

    assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
    assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
    assert_eq!(OrderPlaced::SCHEMA_VERSION, 1);

    assert_eq!(
        serde_json::to_string(&event).unwrap(),
        format!(r#"{{"order_id":"{order_id}","customer_id":"{customer_id}","total_cents":1250}}"#),
    );
}

#[test]
fn through_a_reference() {
    let event = OrderPlaced {
        order_id: Uuid::nil(),
        customer_id: Uuid::nil(),
        total_cents: 0,
    };
    let by_ref: &OrderPlaced = &event;
    assert_eq!(DomainEventTrait::event_type(&by_ref), "order.placed");
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", event_type = "sales.order-placed.v3", version = 3)]
struct Overridden {
    #[aggregate_id]
    id: u64,
}

#[test]
fn explicit_event_type_and_version() {
    let event = Overridden { id: 42 };
    assert_eq!(event.event_type(), "sales.order-placed.v3");
    assert_eq!(event.schema_version(), 3);
    assert_eq!(event.aggregate_id(), "42");
    assert_eq!(Overridden::EVENT_TYPE, "sales.order-placed.v3");
    assert_eq!(Overridden::SCHEMA_VERSION, 3);
    assert_eq!(serde_json::to_string(&event).unwrap(), r#"{"id":42}"#);
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
#[domain_event(version = 2147483647)]
struct MaxVersion {
    #[aggregate_id]
    id: i32,
}

#[test]
fn keys_may_span_several_attributes() {
    assert_eq!(MaxVersion::SCHEMA_VERSION, i32::MAX);
    assert_eq!(MaxVersion { id: -1 }.aggregate_id(), "-1");
}

mod prefixes {
    use outbox_macros::DomainEvent;
    use serde::Serialize;

    #[derive(Serialize, DomainEvent)]
    #[domain_event(aggregate = "order_line")]
    pub(crate) struct OrderLineAdded {
        #[aggregate_id]
        pub(crate) line: String,
    }

    #[derive(Serialize, DomainEvent)]
    #[domain_event(aggregate = "order")]
    pub(crate) struct PaymentCaptured {
        #[aggregate_id]
        pub(crate) order: u32,
    }

    #[derive(Serialize, DomainEvent)]
    #[domain_event(aggregate = "order")]
    pub(crate) struct Order {
        #[aggregate_id]
        pub(crate) id: u8,
    }

    #[derive(Serialize, DomainEvent)]
    #[domain_event(aggregate = "order")]
    pub(crate) struct Orderly {
        #[aggregate_id]
        pub(crate) id: u8,
    }

    #[derive(Serialize, DomainEvent)]
    #[domain_event(aggregate = "shipment")]
    pub(crate) struct HTTPWebhookReceived {
        #[aggregate_id]
        pub(crate) id: u8,
    }

    #[derive(Serialize, DomainEvent)]
    #[domain_event(aggregate = "type")]
    pub(crate) struct r#Type {
        #[aggregate_id]
        pub(crate) r#type: u8,
    }
}

#[test]
fn default_event_type_drops_a_leading_aggregate_name() {
    assert_eq!(prefixes::OrderLineAdded::EVENT_TYPE, "order_line.added");
    assert_eq!(
        prefixes::PaymentCaptured::EVENT_TYPE,
        "order.payment_captured"
    );
    assert_eq!(prefixes::Order::EVENT_TYPE, "order.order");
    assert_eq!(prefixes::Orderly::EVENT_TYPE, "order.orderly");
    assert_eq!(
        prefixes::HTTPWebhookReceived::EVENT_TYPE,
        "shipment.http_webhook_received"
    );
    assert_eq!(prefixes::r#Type::EVENT_TYPE, "type.type");
    let line = prefixes::OrderLineAdded {
        line: "l-1".to_owned(),
    };
    assert_eq!(line.aggregate_id(), "l-1");
    assert_eq!(prefixes::PaymentCaptured { order: 9 }.aggregate_id(), "9");
    assert_eq!(prefixes::r#Type { r#type: 1 }.aggregate_id(), "1");
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderShipped {
    #[aggregate_id]
    order_id: String,
    #[aggregate_version]
    version: i64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct SmallVersion {
    #[aggregate_id]
    order_id: String,
    #[aggregate_version]
    version: u32,
}

#[test]
fn aggregate_version_field() {
    let event = OrderShipped {
        order_id: "o-1".to_owned(),
        version: 7,
    };
    assert_eq!(event.aggregate_id(), "o-1");
    assert_eq!(event.aggregate_version(), Some(7));
    let event = SmallVersion {
        order_id: "o-1".to_owned(),
        version: u32::MAX,
    };
    assert_eq!(event.aggregate_version(), Some(i64::from(u32::MAX)));
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "invoice")]
struct InvoiceIssued(String, #[aggregate_id] u64, #[aggregate_version] i32);

#[test]
fn tuple_struct() {
    let event = InvoiceIssued("INV-1".to_owned(), 77, 4);
    assert_eq!(event.event_type(), "invoice.issued");
    assert_eq!(event.aggregate_id(), "77");
    assert_eq!(event.aggregate_version(), Some(4));
    assert_eq!(serde_json::to_string(&event).unwrap(), r#"["INV-1",77,4]"#);
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "account")]
struct AccountCredited<'a, Id, Meta = ()>
where
    Id: Serialize + Display,
    Meta: Serialize,
{
    #[aggregate_id]
    account: Id,
    reference: &'a str,
    meta: Meta,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "customer")]
struct CustomerRenamed<'a> {
    #[aggregate_id]
    id: &'a str,
    name: &'a str,
}

#[test]
fn generics_and_lifetimes() {
    let reference = String::from("ref-1");
    let event = AccountCredited {
        account: 5_u16,
        reference: &reference,
        meta: (),
    };
    assert_eq!(event.event_type(), "account.credited");
    assert_eq!(event.aggregate_id(), "5");
    assert_eq!(AccountCredited::<'_, u16>::EVENT_TYPE, "account.credited");
    assert_eq!(
        serde_json::to_string(&event).unwrap(),
        r#"{"account":5,"reference":"ref-1","meta":null}"#
    );

    let id = String::from("c-9");
    let renamed = CustomerRenamed {
        id: &id,
        name: "Ada",
    };
    assert_eq!(renamed.event_type(), "customer.renamed");
    assert_eq!(renamed.aggregate_id(), "c-9");
    assert_eq!(
        serde_json::to_string(&renamed).unwrap(),
        r#"{"id":"c-9","name":"Ada"}"#
    );
}

#[derive(Serialize, DomainEvent)]
#[serde(untagged)]
#[domain_event(aggregate = "order", version = 2)]
enum OrderEvent {
    Placed {
        #[aggregate_id]
        order_id: Uuid,
        #[aggregate_version]
        version: i64,
        total_cents: i64,
    },
    #[domain_event(event_type = "order.cancelled.v1", version = 1)]
    OrderCancelled {
        #[aggregate_id]
        order_id: Uuid,
        reason: String,
    },
    #[domain_event(version = 5)]
    Shipped(String, #[aggregate_id] Uuid),
    Order(#[aggregate_id] u64),
}

#[test]
fn enum_variants_are_event_types() {
    let order_id = Uuid::now_v7();
    let placed = OrderEvent::Placed {
        order_id,
        version: 1,
        total_cents: 100,
    };
    assert_eq!(placed.aggregate_type(), "order");
    assert_eq!(placed.event_type(), "order.placed");
    assert_eq!(placed.schema_version(), 2);
    assert_eq!(placed.aggregate_id(), order_id.to_string());
    assert_eq!(placed.aggregate_version(), Some(1));
    assert_eq!(
        serde_json::to_string(&placed).unwrap(),
        format!(r#"{{"order_id":"{order_id}","version":1,"total_cents":100}}"#),
    );

    let cancelled = OrderEvent::OrderCancelled {
        order_id,
        reason: "changed mind".to_owned(),
    };
    assert_eq!(cancelled.event_type(), "order.cancelled.v1");
    assert_eq!(cancelled.schema_version(), 1);
    assert_eq!(cancelled.aggregate_id(), order_id.to_string());
    assert_eq!(cancelled.aggregate_version(), None);
    assert_eq!(
        serde_json::to_string(&cancelled).unwrap(),
        format!(r#"{{"order_id":"{order_id}","reason":"changed mind"}}"#),
    );

    let shipped = OrderEvent::Shipped("DHL".to_owned(), order_id);
    assert_eq!(shipped.event_type(), "order.shipped");
    assert_eq!(shipped.schema_version(), 5);
    assert_eq!(shipped.aggregate_id(), order_id.to_string());
    assert_eq!(shipped.aggregate_version(), None);
    assert_eq!(
        serde_json::to_string(&shipped).unwrap(),
        format!(r#"["DHL","{order_id}"]"#),
    );

    let order = OrderEvent::Order(12);
    assert_eq!(order.event_type(), "order.order");
    assert_eq!(order.aggregate_id(), "12");
    assert_eq!(serde_json::to_string(&order).unwrap(), "12");

    assert_eq!(OrderEvent::AGGREGATE_TYPE, "order");
    assert_eq!(
        OrderEvent::EVENT_TYPES,
        [
            "order.placed",
            "order.cancelled.v1",
            "order.shipped",
            "order.order"
        ],
    );
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "cart")]
enum CartEvent<T: Serialize + Display> {
    ItemAdded {
        #[aggregate_id]
        cart: T,
        sku: String,
    },
    CartCleared {
        #[aggregate_id]
        cart: T,
    },
}

#[test]
fn generic_enum_with_default_serde_representation() {
    let added = CartEvent::ItemAdded {
        cart: 3_i64,
        sku: "sku-1".to_owned(),
    };
    assert_eq!(added.event_type(), "cart.item_added");
    assert_eq!(added.schema_version(), 1);
    assert_eq!(added.aggregate_id(), "3");
    assert_eq!(added.aggregate_version(), None);
    assert_eq!(
        serde_json::to_string(&added).unwrap(),
        r#"{"ItemAdded":{"cart":3,"sku":"sku-1"}}"#
    );
    let cleared: CartEvent<&str> = CartEvent::CartCleared { cart: "c" };
    assert_eq!(cleared.event_type(), "cart.cleared");
    assert_eq!(cleared.aggregate_id(), "c");
    assert_eq!(
        CartEvent::<u8>::EVENT_TYPES,
        ["cart.item_added", "cart.cleared"]
    );
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", crate = "::outbox_core")]
struct WithCratePath {
    #[aggregate_id]
    id: u64,
}

#[test]
fn crate_path_override() {
    fn assert_event<E: outbox_core::DomainEvent>(event: &E) -> &'static str {
        event.event_type()
    }
    assert_eq!(
        assert_event(&WithCratePath { id: 1 }),
        "order.with_crate_path"
    );
}
