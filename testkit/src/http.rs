//! A one-shot HTTP `GET` (hyper's client), for the proxy's operations endpoint: `/metrics`,
//! `/healthz`, `/readyz`, with an `Accept` header if asked; and the value of one series in a
//! scrape.

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// `GET http://addr{path}`: the status and the body, within 5 s.
pub async fn get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let answer = get_accepting(addr, path, None).await?;
    Ok((answer.status, answer.body))
}

/// An answer to a `GET`.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Its `Content-Type` (empty without one).
    pub content_type: String,
    pub body: String,
}

/// `GET http://addr{path}` with `Accept: {accept}` (none for `None`), within 5 s.
pub async fn get_accepting(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> io::Result<Answer> {
    tokio::time::timeout(Duration::from_secs(5), get_now(addr, path, accept))
        .await
        .map_err(|_| io::Error::other(format!("GET {addr}{path}: no answer within 5 s")))?
}

async fn get_now(addr: SocketAddr, path: &str, accept: Option<&str>) -> io::Result<Answer> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let mut request = hyper::Request::get(path).header(hyper::header::HOST, addr.to_string());
    if let Some(accept) = accept {
        request = request.header(hyper::header::ACCEPT, accept);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    Ok(Answer {
        status,
        content_type,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The value of the series `series` (name and labels exactly as exposed, e.g.
/// `redlock_proxy_acquires_total{result="granted"}`) in a scrape; `None` if absent.
pub fn series(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// The metric names a scrape in the Prometheus text format (the endpoint's default) exposes:
/// its `# TYPE` lines' names, which are the names samples are written with (counters with
/// `_total`), histograms aside (their base name, then `_bucket`, `_sum`, `_count`).
pub fn exposed_names(scrape: &str) -> Vec<String> {
    scrape
        .lines()
        .filter_map(|line| {
            let name = line.strip_prefix("# TYPE ")?.split_whitespace().next()?;
            Some(name.to_string())
        })
        .collect()
}
