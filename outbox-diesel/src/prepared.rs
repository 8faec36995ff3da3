//! Raw SQL that stays prepared on its connection.
//!
//! Diesel treats every `sql_query` as unsafe to cache, so diesel-async
//! prepares it anew on each run: one round trip to parse and describe the
//! statement, then another to execute it. The outbox's statements are
//! rendered once per schema and never change, so they can be prepared once
//! per connection like Diesel's own DSL queries. The statement cache is keyed
//! by the SQL text and the bind types.
//!
//! Measured figures are in the crate docs ("Prepared statements"). Callers
//! can turn it off (`prepared_statements(false)`) for poolers that cannot
//! keep prepared statements.

use diesel::QueryResult;
use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};

/// `Q`, marked safe to keep prepared when `keep` (see the module docs); as
/// `Q` (prepared anew on each run) otherwise. Only for SQL whose text is
/// fixed for the life of the process: each distinct text stays prepared on
/// every connection that ran it.
#[derive(Debug, Clone)]
pub(crate) struct Prepared<Q> {
    query: Q,
    keep: bool,
}

impl<Q> Prepared<Q> {
    pub(crate) fn new(query: Q, keep: bool) -> Self {
        Prepared { query, keep }
    }
}

impl<DB: Backend, Q: QueryFragment<DB>> QueryFragment<DB> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.query.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> QueryResult<bool> {
        Ok(self.keep)
    }
}

impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

impl<Q, C> diesel::RunQueryDsl<C> for Prepared<Q> {}

/// `.prepared(keep)` on any query.
pub(crate) trait PreparedExt: Sized {
    /// Marks `self` safe to keep prepared on its connection when `keep`.
    fn prepared(self, keep: bool) -> Prepared<Self> {
        Prepared::new(self, keep)
    }
}

impl<Q> PreparedExt for Q {}
