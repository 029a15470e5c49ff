//! Resident memory per idle client connection.

use crate::procs::vm_rss_bytes;
use crate::resp::io_err;
use futures::stream::{self, StreamExt};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
            let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
            s.write_all(b"PING\r\n").await?;
            let mut reply = [0u8; 7];
            tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut reply))
                .await
                .map_err(|_| io_err("PING timed out".into()))??;
            if &reply != b"+PONG\r\n" {
                return Err(io_err(format!(
                    "PING answered {:?}",
                    String::from_utf8_lossy(&reply)
                )));
            }
            Ok(s)
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
