//! A one-shot HTTP `GET` (hyper's client), for the proxy's operations endpoint: `/metrics`,
//! `/healthz`, `/readyz`; and the value of one series in a scrape.

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// `GET http://addr{path}`: the status and the body, within 5 s.
pub async fn get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    tokio::time::timeout(Duration::from_secs(5), get_now(addr, path))
        .await
        .map_err(|_| io::Error::other(format!("GET {addr}{path}: no answer within 5 s")))?
}

async fn get_now(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The value of the series `series` (name and labels exactly as exposed, e.g.
/// `redlock_proxy_acquires_total{result="granted"}`) in a scrape; `None` if absent.
pub fn series(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// The metric names a scrape exposes (the `# TYPE` lines' names, as written in samples:
/// counters with `_total`, infos with `_info`).
pub fn exposed_names(scrape: &str) -> Vec<String> {
    scrape
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
            let (name, kind) = (words.next()?, words.next()?);
            Some(match kind {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.to_string(),
            })
        })
        .collect()
}
