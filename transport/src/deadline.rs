//! Each gRPC call's deadline (its `grpc-timeout`), ended with
//! DEADLINE_EXCEEDED.
//!
//! tonic's server enforces `grpc-timeout` itself, outside every layer of
//! ours, and ends a call whose deadline passes with CANCELLED "Timeout
//! expired" (tonic's choice, see its `TimeoutExpired`), where gRPC servers
//! answer DEADLINE_EXCEEDED; it also drops the handler before the handler
//! can count or log the call. So whether a caller saw DEADLINE_EXCEEDED or
//! CANCELLED depended on which of three timers fired first.
//!
//! [`DeadlineLayer`] sits inside tonic's timer and always ends the call
//! first: it takes the deadline before tonic does, and each time it is
//! polled it checks the clock as well as its timer, so by the time tonic's
//! timer fires this layer has answered. Handlers read the deadline from the
//! request's extensions ([`CallDeadline`]) and give up
//! [`HANDLER_HEAD_START`] before it, with their own, more specific status.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{HeaderMap, Request, Response};
use tonic::Status;

use fnrun_api::duration::format as humantime;

/// How much earlier than the layer a handler gives up: one tick of tokio's
/// timer, so that the handler's timer fires first.
pub const HANDLER_HEAD_START: Duration = Duration::from_millis(1);

/// A call's deadline: its budget from `grpc-timeout`, counted from when the
/// call arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDeadline {
    arrived: Instant,
    budget: Duration,
}

impl CallDeadline {
    /// A deadline `budget` from now.
    pub fn from_now(budget: Duration) -> CallDeadline {
        CallDeadline {
            arrived: Instant::now(),
            budget,
        }
    }

    /// The deadline [`DeadlineLayer`] took for `request`, if it had a valid
    /// `grpc-timeout`.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<CallDeadline> {
        request.extensions().get::<CallDeadline>().copied()
    }

    /// The call's whole budget, as the caller gave it.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// When the call ends.
    pub fn at(&self) -> Instant {
        self.arrived + self.budget
    }

    /// When a handler should give up: [`HANDLER_HEAD_START`] before
    /// [`CallDeadline::at`], but not before the call arrived.
    pub fn for_handler(&self) -> Instant {
        self.at()
            .checked_sub(HANDLER_HEAD_START)
            .unwrap_or(self.arrived)
            .max(self.arrived)
    }
}

/// The call's `grpc-timeout`: 1 to 8 digits and a unit (H, M, S, m, u, n),
/// as gRPC over HTTP/2 defines it; anything else is no deadline.
pub fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Ends each call with DEADLINE_EXCEEDED when its `grpc-timeout` passes;
/// install with `Server::builder().layer(DeadlineLayer)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

/// The service of [`DeadlineLayer`].
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
}

impl<S, B, R> tower::Service<Request<B>> for Deadline<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: Default + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let Some(budget) = grpc_timeout(request.headers()) else {
            return Box::pin(self.inner.call(request));
        };
        // Taken before the inner service runs, and so before tonic takes
        // its own (it calls this service first, then starts its timer).
        let deadline = CallDeadline::from_now(budget);
        request.extensions_mut().insert(deadline);
        let mut inner = Box::pin(self.inner.call(request));
        let at = tokio::time::Instant::from_std(deadline.at());
        let mut timer = Box::pin(tokio::time::sleep_until(at));
        Box::pin(std::future::poll_fn(move |cx| {
            if let Poll::Ready(answer) = inner.as_mut().poll(cx) {
                return Poll::Ready(answer);
            }
            if timer.as_mut().poll(cx).is_ready() || tokio::time::Instant::now() >= at {
                return Poll::Ready(Ok(expired(budget)));
            }
            Poll::Pending
        }))
    }
}

/// The answer to a call whose deadline passed before its handler answered.
fn expired<R: Default>(budget: Duration) -> Response<R> {
    Status::deadline_exceeded(format!(
        "the call's deadline of {} passed",
        humantime(budget)
    ))
    .into_http()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().unwrap());
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeouts() {
        assert_eq!(timeout("20S"), Some(Duration::from_secs(20)));
        assert_eq!(timeout("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "S", "123456789S", "1x", "-1S", "1.5S"] {
            assert_eq!(timeout(bad), None, "{bad}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }

    /// A gRPC service: `Never` never answers; `Handler` answers OK at once
    /// without a deadline, else gives up at [`CallDeadline::for_handler`]
    /// with its own status, as the functions listener's handler does.
    #[derive(Clone)]
    struct Stall;

    impl tonic::server::NamedService for Stall {
        const NAME: &'static str = "test.Stall";
    }

    impl tower::Service<Request<tonic::body::Body>> for Stall {
        type Response = Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
            let deadline = request.extensions().get::<CallDeadline>().copied();
            let never = request.uri().path().ends_with("/Never");
            Box::pin(async move {
                if never {
                    std::future::pending::<()>().await;
                }
                Ok(match deadline {
                    None => Status::ok("no deadline").into_http(),
                    Some(d) => {
                        tokio::time::sleep_until(d.for_handler().into()).await;
                        Status::deadline_exceeded("the handler gave up").into_http()
                    }
                })
            })
        }
    }

    /// The status of `calls` calls of `method`,
    /// all at once on one connection, each with `grpc-timeout` `timeout`,
    /// to tonic's server serving [`Stall`], with [`DeadlineLayer`] or not.
    async fn call_stall(
        layer: bool,
        method: &str,
        timeout: Option<&str>,
        calls: usize,
    ) -> Vec<(tonic::Code, String)> {
        use http_body_util::Empty;
        use hyper_util::rt::{TokioExecutor, TokioIo};

        let (client, server) = tokio::io::duplex(1 << 20);
        let incoming = futures::stream::iter([Ok::<_, std::io::Error>(server)]);
        let serving = if layer {
            tokio::spawn(
                tonic::transport::Server::builder()
                    .layer(DeadlineLayer)
                    .add_service(Stall)
                    .serve_with_incoming(incoming),
            )
        } else {
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(Stall)
                    .serve_with_incoming(incoming),
            )
        };
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client))
                .await
                .expect("handshake");
        tokio::spawn(connection);
        let calls = (0..calls).map(|_| {
            let mut sender = sender.clone();
            let mut request = Request::post(format!("http://test/test.Stall/{method}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers");
            if let Some(timeout) = timeout {
                request = request.header("grpc-timeout", timeout);
            }
            let request = request.body(Empty::<bytes::Bytes>::new()).unwrap();
            async move {
                let response = sender.send_request(request).await.expect("an answer");
                let status = Status::from_header_map(response.headers()).expect("a grpc-status");
                (status.code(), status.message().to_owned())
            }
        });
        let answers = futures::future::join_all(calls).await;
        serving.abort();
        answers
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn tonic_alone_ends_an_expired_call_with_cancelled() {
        // Why the layer exists; if this fails, tonic answers as gRPC does now.
        let answers = runtime().block_on(call_stall(false, "Never", Some("20m"), 1));
        assert_eq!(
            answers[0],
            (tonic::Code::Cancelled, "Timeout expired".to_owned())
        );
    }

    #[test]
    fn an_expired_call_ends_with_deadline_exceeded() {
        let answers = runtime().block_on(call_stall(true, "Never", Some("20m"), 50));
        for answer in answers {
            assert_eq!(
                answer,
                (
                    tonic::Code::DeadlineExceeded,
                    "the call's deadline of 20ms passed".to_owned()
                )
            );
        }
    }

    #[test]
    fn a_handler_that_gives_up_answers_with_its_own_status() {
        let answers = runtime().block_on(call_stall(true, "Handler", Some("20m"), 50));
        for answer in answers {
            assert_eq!(
                answer,
                (
                    tonic::Code::DeadlineExceeded,
                    "the handler gave up".to_owned()
                )
            );
        }
        // Without `grpc-timeout`, no deadline.
        let unbounded = runtime().block_on(call_stall(true, "Handler", None, 1));
        assert_eq!(unbounded[0], (tonic::Code::Ok, "no deadline".to_owned()));
    }

    #[test]
    fn a_handler_gives_up_just_before_the_call_ends() {
        let d = CallDeadline::from_now(Duration::from_secs(2));
        assert_eq!(d.at() - d.for_handler(), HANDLER_HEAD_START);
        assert_eq!(d.budget(), Duration::from_secs(2));
        let tiny = CallDeadline::from_now(Duration::from_micros(10));
        assert_eq!(tiny.for_handler(), tiny.arrived);
    }
}
