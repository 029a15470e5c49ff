//! The HTTP endpoint (hyper): `GET /metrics` (the exposition of [`super::metrics`], in the
//! format the scraper's `Accept` header asks for: [`metrics::Format::negotiate`]),
//! `GET /healthz` (200 while the process serves) and `GET /readyz` (200 while a quorum of
//! masters may vote, else 503 with the reason), for Prometheus, load balancers and
//! Kubernetes probes; and for a person, the status view ([`super::status`]): the page at `/`
//! and `/status`, its facts at `/status.json`, their windows sampled once a second here.

use super::metrics;
use super::status::{History, Status};
use crate::shared::Shared;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A scrape or probe that has not sent its request by then is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `addr` and serves the endpoint until `stop` becomes true; records the bound address
/// in `shared.metrics_addr`.
pub async fn start(
    addr: &str,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let _ = shared.metrics_addr.set(bound);
    tracing::info!(metrics = %bound, "metrics endpoint listening on http://{bound}/metrics");
    tokio::spawn(serve(listener, shared, stop));
    Ok(())
}

async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let registry = Arc::new(metrics::registry(shared.clone()));
    let history = Arc::new(History::new(&shared));
    tokio::spawn(sample_every_second(
        history.clone(),
        shared.clone(),
        stop.clone(),
    ));
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Only `true` is ever sent: any change is the stop.
            _ = stop.changed() => return,
        };
        let (shared, registry, history) = (shared.clone(), registry.clone(), history.clone());
        let service = service_fn(move |request| {
            let response = respond(&request, &shared, &registry, &history);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

/// Samples the counters of the status view's windows once a second, until `stop`.
async fn sample_every_second(
    history: Arc<History>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => history.sample(&shared),
            _ = stop.changed() => return,
        }
    }
}

fn respond(
    request: &Request<Incoming>,
    shared: &Shared,
    registry: &Registry,
    history: &History,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response.headers_mut().insert(CONTENT_TYPE, value);
        }
        response
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            let accept = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
            let format = metrics::Format::negotiate(accept);
            let body = metrics::encode(registry, format);
            reply(StatusCode::OK, format.content_type(), body)
        }
        "/" | "/status" => {
            let page = Status::now(shared, history).page();
            reply(StatusCode::OK, "text/html; charset=utf-8", page)
        }
        "/status.json" => {
            let json = Status::now(shared, history).to_json();
            reply(StatusCode::OK, "application/json", json)
        }
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => match super::readiness(shared) {
            Ok(ready) => reply(StatusCode::OK, TEXT, ready),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, why),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /metrics, /healthz, /readyz, /status, /status.json\n".into(),
        ),
    }
}
