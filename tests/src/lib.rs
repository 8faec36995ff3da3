//! Cross-crate end-to-end tests of the outbox workspace. They use the `outbox`
//! facade exactly as an application does; the tests against real PostgreSQL
//! and RabbitMQ arrive with the adapters.
