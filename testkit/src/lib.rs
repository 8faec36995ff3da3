//! The workspace's test kit: everything a test needs around the code under
//! test, written once.
//!
//! ```no_run
//! # async fn f() {
//! use std::time::Duration;
//! use outbox_testkit::amqp::TestBroker;
//! use outbox_testkit::eventually::eventually;
//! use outbox_testkit::names::unique;
//! use outbox_testkit::pg::TestSchema;
//!
//! // A schema and broker objects of this test only; both removed when the
//! // test ends, also when it panics.
//! let schema = TestSchema::new("t", "orders_flow").await;
//! let broker = TestBroker::new(unique("test", "orders_flow")).await;
//! let exchange = broker.topic_exchange(&broker.named("x")).await;
//! let queue = broker.queue(&broker.named("q")).await;
//! broker.bind(&queue, &exchange, "order.*").await;
//!
//! schema.run("CREATE TABLE {schema}.orders (id int)").await;
//! // ... run the code under test against `schema.name()` and `exchange` ...
//! broker
//!     .publish(&exchange, "order.placed", b"{}", Default::default())
//!     .await;
//! eventually("the message is in the queue")
//!     .within(Duration::from_secs(5))
//!     .equals(1, || broker.ready(&queue))
//!     .await;
//! # }
//! ```
//!
//! # Modules
//!
//! | module | for |
//! |---|---|
//! | [`urls`] | where the shared servers are (`DATABASE_URL`, `AMQP_URL`, `MYSQL_URL`, or the defaults of `scripts/dev-services`), a URL naming another database, redaction, the "not reachable: start it with scripts/dev-services" message |
//! | [`names`] | unique names (`<prefix>_<test>_<pid>_<n>`, one counter per process) cut to PostgreSQL's 63 bytes at a character boundary, the unique tail kept |
//! | [`eventually`] | polling until something holds, equals a value or is found, failing with what was awaited and the last value seen; [`within`](eventually::within) for a future that must finish |
//! | [`pg`] | [`TestSchema`](pg::TestSchema) (a schema and a pool on its database) and [`TestDatabase`](pg::TestDatabase) guards, [`connect`](pg::connect), [`count`](pg::count), [`backend_pid`](pg::backend_pid) |
//! | [`mysql`] | [`TestMysqlDatabase`](mysql::TestMysqlDatabase) (a database of the test on MariaDB, dropped with the sessions using it killed), [`connect`](mysql::connect), [`count`](mysql::count) |
//! | [`sqlite`] | [`TestSqliteFile`](sqlite::TestSqliteFile) (a unique SQLite file path of the test, removed with its WAL files on drop) |
//! | [`amqp`] | [`TestBroker`](amqp::TestBroker) (exchanges and queues declared through it, deleted on drop; publish with confirm, ready count, drain, peek), [`BrokerCleanup`](amqp::BrokerCleanup) (the same deletion for objects declared over connections of the test's own, holding no connection until then), [`connect`](amqp::connect), finding and force-closing connections with `rabbitmqctl` |
//! | [`net`] | [`free_port`](net::free_port) |
//! | [`servers`] | [`PrivatePostgres`](servers::PrivatePostgres) (a throwaway `initdb` cluster), [`PrivateMariadb`](servers::PrivateMariadb) (a throwaway `mariadbd` with TLS) and [`PrivateRabbit`](servers::PrivateRabbit) (a second node) that a test may crash, restart, freeze |
//! | [`pki`] | [`TestPki`](pki::TestPki): a throwaway CA and server certificate for TLS tests |
//!
//! # Teardown
//!
//! A test that fails must not leave its schema, database, exchange or
//! queues behind (they pile up, and a later run with the same process id
//! could meet them), and it must not hang. So every guard cleans up in
//! `Drop`, which runs when the test ends and while it unwinds from a panic,
//! and does so on a thread of its own with a runtime of its own, bounded to
//! 10 s: `Drop` may run inside the test's runtime (where blocking on a
//! future panics, and where, on a current-thread runtime, the test's own
//! tasks cannot run while it blocks), outside any runtime, or while the
//! runtime shuts down. The broker guard deletes with a connection of its
//! own, since the test may have broken its connection on purpose.
//!
//! Dropping a schema has one more trap: sessions of the test itself (a
//! relay's claim, a consumer's open transaction) may hold locks in it, and
//! their tasks cannot run to release them while `Drop` blocks, so a plain
//! `DROP SCHEMA` would wait forever. [`pg::drop_schema`] terminates every
//! other backend holding a lock in the schema, then drops it with a 1 s
//! `lock_timeout`, and tries again when a session took a new lock in
//! between (details in [`pg`]). A database is dropped `WITH (FORCE)`.
//! What could not be removed in time is reported on the test's stderr.
//!
//! # Dependencies
//!
//! The kit depends on the drivers only (diesel, diesel-async, deadpool,
//! lapin, tokio, uuid), never on an `outbox-*` crate, so every crate of the
//! workspace, the adapters included, can dev-depend on it without a cycle.
//! What needs the library's types (migrating a schema, recording events, a
//! `QueueTopology`) stays in each test crate's `tests/common` or in
//! `outbox-tests`, built on the kit.
//!
//! The benchmark (`outbox-bench`, a binary that is never published) uses
//! the kit as a normal dependency, which `publish = false` allows: the
//! URLs, the run's unique name, and its exchange and queue, deleted also
//! when a run fails half-way. It creates and drops its schema through the
//! library, not with [`pg::TestSchema`]: the bench may run against a
//! TLS-only PostgreSQL (its `postgres-tls` feature), and the kit speaks
//! plaintext.
//!
//! The kit speaks plaintext to PostgreSQL (diesel-async's own connection):
//! the TLS tests connect through the library and use [`servers`] and
//! [`pki`] for a TLS-only server of their own.

pub mod amqp;
pub mod eventually;
pub mod mysql;
pub mod names;
pub mod net;
pub mod pg;
pub mod pki;
pub mod servers;
pub mod sqlite;
mod teardown;
pub mod urls;
