//! Resident memory per idle client connection.

use crate::procs::vm_rss_bytes;
use futures::stream::{self, StreamExt};
use redlock_testkit::resp::Client;
use std::time::Duration;
use tokio::net::TcpStream;

#[derive(Clone, Debug)]
pub struct MemResult {
    pub scenario: String,
    pub conns: usize,
    pub opened: usize,
    pub refused: usize,
    pub before: u64,
    pub after: u64,
    pub note: Option<String>,
}

impl MemResult {
    pub fn per_conn(&self) -> Option<f64> {
        (self.opened > 0).then(|| (self.after as f64 - self.before as f64) / self.opened as f64)
    }
}

/// Opens `n` connections that each send one PING and read PONG, and keeps them open.
pub async fn open_idle(port: u16, n: usize) -> (Vec<TcpStream>, usize, Option<String>) {
    let results: Vec<std::io::Result<TcpStream>> = stream::iter(0..n)
        .map(|_| async move {
            let mut c = Client::open(port, Duration::from_secs(10)).await?;
            c.write(b"PING\r\n").await?;
            let reply = c
                .read_reply(std::time::Instant::now() + Duration::from_secs(10))
                .await?;
            if reply.text().as_deref() != Some("PONG") {
                return Err(std::io::Error::other(format!("PING answered {reply}")));
            }
            // Only the socket stays open (not the client's read buffer).
            Ok(c.into_stream())
        })
        .buffer_unordered(200)
        .collect()
        .await;
    let mut open = Vec::with_capacity(n);
    let mut refused = 0;
    let mut first_error = None;
    for r in results {
        match r {
            Ok(s) => open.push(s),
            Err(err) => {
                refused += 1;
                first_error.get_or_insert_with(|| err.to_string());
            }
        }
    }
    (open, refused, first_error)
}

pub async fn measure_idle(scenario: &str, pid: u32, port: u16, n: usize) -> MemResult {
    // One connection first, so the measurement does not include first-use allocations.
    let (warm, _, _) = open_idle(port, 1).await;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = vm_rss_bytes(pid).unwrap_or(0);
    let (open, refused, first_error) = open_idle(port, n).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = vm_rss_bytes(pid).unwrap_or(0);
    let opened = open.len();
    drop(open);
    MemResult {
        scenario: scenario.into(),
        conns: n,
        opened,
        refused,
        before,
        after,
        note: first_error.map(|e| format!("{refused} failed: {e}")),
    }
}
