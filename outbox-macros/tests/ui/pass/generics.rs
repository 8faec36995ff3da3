//! Generic types and lifetimes keep their generics and `where` clause.

use std::fmt::Display;

use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "note")]
pub struct NoteWritten<'a> {
    #[aggregate_id]
    pub id: &'a str,
    pub text: &'a str,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "ledger")]
pub struct LedgerPosted<Id, const N: usize>
where
    Id: Serialize + Display,
    [i64; N]: Serialize,
{
    #[aggregate_id]
    pub ledger: Id,
    pub lines: [i64; N],
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "box")]
pub enum BoxEvent<'a, T: Serialize + Display + 'a> {
    Opened(#[aggregate_id] &'a T),
}

fn main() {
    let text = String::from("hello");
    let note = NoteWritten {
        id: "n-1",
        text: &text,
    };
    assert_eq!(note.aggregate_id(), "n-1");
    let posted = LedgerPosted {
        ledger: 9_u8,
        lines: [1, -1],
    };
    assert_eq!(posted.event_type(), "ledger.posted");
    assert_eq!(LedgerPosted::<u8, 2>::EVENT_TYPE, "ledger.posted");
    let id = 5_u32;
    assert_eq!(BoxEvent::Opened(&id).aggregate_id(), "5");
}
