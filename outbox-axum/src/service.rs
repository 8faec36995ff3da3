//! [`OutboxService`]: the middleware wrapping each request.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::BoxError;
use axum::body::{Bytes, HttpBody};
use axum::response::Response;
use http::Request;
use tower::Service;

use crate::ResponseFuture;
use crate::correlation::event_headers;
use crate::layer::Config;
use crate::request::RequestScope;

/// The middleware built by [`OutboxLayer`](crate::OutboxLayer): runs the
/// inner service (the handler) inside a request scope, then commits or
/// rolls back the request's transaction.
#[derive(Clone)]
pub struct OutboxService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: fmt::Debug> fmt::Debug for OutboxService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> OutboxService<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        OutboxService { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for OutboxService<S>
where
    S: Service<Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let headers = event_headers(request.headers(), &self.config.correlation_headers);
        let scope = RequestScope::new(Arc::clone(&self.config), headers);
        scope.install(request.extensions_mut());
        // The clone that was not driven to readiness stays here (tower's
        // usual swap), the ready one serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let handler = scope.events().scope(inner.call(request));
        ResponseFuture::new(Box::pin(handler), scope)
    }
}
