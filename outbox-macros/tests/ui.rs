//! Compile-pass and compile-fail tests of `#[derive(DomainEvent)]` (trybuild).
//!
//! Regenerate the expected `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p outbox-macros --test ui`, then review them.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
