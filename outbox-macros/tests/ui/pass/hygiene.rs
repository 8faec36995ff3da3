//! The expansion uses absolute paths only: it works without the prelude, next
//! to items that shadow std names, and inside `macro_rules!`.

#[no_implicit_prelude]
mod no_prelude {
    #[derive(::serde::Serialize, ::outbox::DomainEvent)]
    #[domain_event(aggregate = "order")]
    pub struct OrderPlaced {
        #[aggregate_id]
        pub order_id: ::std::string::String,
        #[aggregate_version]
        pub version: i64,
    }

    #[derive(::serde::Serialize, ::outbox::DomainEvent)]
    #[serde(untagged)]
    #[domain_event(aggregate = "order")]
    pub enum OrderEvent {
        Shipped(#[aggregate_id] u64, #[aggregate_version] u32),
    }
}

#[allow(dead_code)]
mod shadowing {
    use outbox::DomainEvent;
    use serde::Serialize;

    struct String;
    struct Option;
    struct Some;
    trait ToString {}
    trait Display {}
    trait Into {}
    trait Clone {}
    mod core {}
    mod std {}

    #[derive(Serialize, DomainEvent)]
    #[domain_event(aggregate = "order")]
    pub struct OrderPaid {
        #[aggregate_id]
        pub order_id: u64,
        #[aggregate_version]
        pub version: i64,
    }
}

macro_rules! event {
    ($name:ident, $id:ident: $ty:ty, $aggregate:literal) => {
        #[derive(serde::Serialize, outbox::DomainEvent)]
        #[domain_event(aggregate = $aggregate, version = 2)]
        pub struct $name {
            #[aggregate_id]
            pub $id: $ty,
        }
    };
}

event!(OrderClosed, order_id: u64, "order");

fn main() {
    use outbox::DomainEvent;

    let placed = no_prelude::OrderPlaced {
        order_id: "o-1".to_owned(),
        version: 3,
    };
    assert_eq!(placed.aggregate_id(), "o-1");
    assert_eq!(placed.aggregate_version(), Some(3));
    let shipped = no_prelude::OrderEvent::Shipped(4, 5);
    assert_eq!(shipped.aggregate_id(), "4");
    assert_eq!(shipped.aggregate_version(), Some(5));
    let paid = shadowing::OrderPaid {
        order_id: 7,
        version: 1,
    };
    assert_eq!(paid.event_type(), "order.paid");
    let closed = OrderClosed { order_id: 9 };
    assert_eq!(closed.event_type(), "order.closed");
    assert_eq!(closed.schema_version(), 2);
    assert_eq!(closed.aggregate_id(), "9");
}
