//! [`ResponseFuture`]: the handler's future, then the commit.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::BoxError;
use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;
use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, CatchUnwind};
use pin_project_lite::pin_project;

use crate::request::RequestScope;

type Handler<B, E> =
    CatchUnwind<AssertUnwindSafe<BoxFuture<'static, Result<http::Response<B>, E>>>>;

pin_project! {
    /// Response future of [`OutboxService`](crate::OutboxService).
    ///
    /// First it drives the handler inside the request's scope (collector
    /// and context headers), catching a panic; then it commits or rolls
    /// back. Dropped at any point, it rolls back: the open transaction's
    /// connection is closed, never returned to the pool inside `BEGIN`.
    pub struct ResponseFuture<B, E> {
        #[pin]
        state: State<B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<B, E> {
        Handler {
            #[pin]
            handler: Handler<B, E>,
            scope: RequestScope,
        },
        Finishing {
            finish: BoxFuture<'static, Response>,
        },
        Done,
    }
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new(
        handler: BoxFuture<'static, Result<http::Response<B>, E>>,
        scope: RequestScope,
    ) -> Self {
        ResponseFuture {
            state: State::Handler {
                handler: AssertUnwindSafe(handler).catch_unwind(),
                scope,
            },
        }
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Handler { .. } => "handler",
            State::Finishing { .. } => "finishing",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<B, E> Future for ResponseFuture<B, E>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Handler { handler, .. } => {
                    let outcome = ready!(handler.poll(cx));
                    // Drops the handler's future first, and with it any `Tx`
                    // it still held, so the scope can take the transaction.
                    let StateReplace::Handler { scope, .. } =
                        state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state was `Handler` a moment ago");
                    };
                    match outcome {
                        Err(panic) => {
                            tracing::error!(
                                panic = panic_message(&*panic),
                                "handler panicked: transaction rolled back, staged events dropped"
                            );
                            drop(scope); // closes the connection: rollback
                            std::panic::resume_unwind(panic);
                        }
                        Ok(Err(error)) => {
                            drop(scope);
                            return Poll::Ready(Err(error));
                        }
                        Ok(Ok(response)) => {
                            let finish = scope.finish(response.map(Body::new));
                            state.set(State::Finishing {
                                finish: Box::pin(finish),
                            });
                        }
                    }
                }
                StateProj::Finishing { finish } => {
                    let response = ready!(finish.as_mut().poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("`ResponseFuture` polled after completion"),
            }
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}
