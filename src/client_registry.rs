//! The registry of connected clients ([`Clients`]) behind `CLIENT LIST` / `CLIENT KILL`, and
//! what it shows of each ([`ClientHandle`]).
//!
//! Invariant: a client is in the registry exactly while its connection is served: its
//! [`Registration`] removes it when the connection's task ends, however it ends.

use crate::protocol::Protocol;
use bytes::Bytes;
use futures::task::AtomicWaker;
use std::collections::BTreeMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// What `CLIENT LIST` shows of a client that its own commands change.
#[derive(Debug, Default, Clone)]
pub struct ClientNames {
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    pub resp: u8,
    /// The user it is authenticated as (`default` before any `AUTH`, as Redis shows).
    pub user: String,
    /// Channels, patterns and shard channels it is subscribed to.
    pub subscriptions: [usize; 3],
    /// Waiting in a blocked pop.
    pub blocked: bool,
}

impl ClientNames {
    /// Redis' client type: `pubsub` for a RESP2 client in subscribed mode, else `normal`.
    pub fn kind(&self) -> &'static str {
        if self.resp == 2 && self.subscriptions.iter().any(|n| *n > 0) {
            "pubsub"
        } else {
            "normal"
        }
    }

    /// Redis' `flags=`: `P` subscribed, `b` blocked, else `N`.
    pub fn flags(&self) -> &'static str {
        match (self.subscriptions.iter().any(|n| *n > 0), self.blocked) {
            (true, true) => "Pb",
            (true, false) => "P",
            (false, true) => "b",
            (false, false) => "N",
        }
    }
}

/// One connected client as the registry sees it.
#[derive(Debug)]
pub struct ClientHandle {
    pub id: u64,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub created: Instant,
    /// When its last command was read, in ms since `created`.
    last_active_ms: AtomicU64,
    /// Its last command, as `CLIENT LIST` shows it ([`crate::commands::shown_name`];
    /// `usize::MAX`: none yet).
    last_command: AtomicUsize,
    names: Mutex<ClientNames>,
    /// Asked of its connection from outside: [`KILL`], [`STOP`].
    signals: AtomicU8,
    /// The connection's task, woken by a signal. Its loop registers it whenever it waits (twice
    /// per request): an atomic swap, where a `Notify` or a `watch` takes a lock.
    waker: AtomicWaker,
}

/// `CLIENT KILL`: close at once.
const KILL: u8 = 1;
/// Shutdown: finish what is in flight, then close.
const STOP: u8 = 2;

impl ClientHandle {
    /// Notes a command (`slot`: see [`ClientHandle::last_command`]) read at `at`.
    pub fn touch(&self, slot: Option<usize>, at: Instant) {
        let ms = at.saturating_duration_since(self.created).as_millis() as u64;
        self.last_active_ms.store(ms, Ordering::Relaxed);
        self.last_command
            .store(slot.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// Publishes the names the client's session now has.
    pub fn set_names(
        &self,
        name: &Option<Bytes>,
        lib: (&Option<Bytes>, &Option<Bytes>),
        resp: Protocol,
        user: Option<&str>,
    ) {
        if let Ok(mut names) = self.names.lock() {
            names.user = user.unwrap_or(crate::auth::DEFAULT_USER).to_string();
            names.name.clone_from(name);
            names.lib_name.clone_from(lib.0);
            names.lib_ver.clone_from(lib.1);
            names.resp = match resp {
                Protocol::Resp2 => 2,
                Protocol::Resp3 => 3,
            };
        }
    }

    /// Notes what the client is subscribed to (channels, patterns, shard channels).
    pub fn set_subscriptions(&self, counts: [usize; 3]) {
        if let Ok(mut names) = self.names.lock() {
            names.subscriptions = counts;
        }
    }

    /// Notes whether the client waits in a blocked pop.
    pub fn set_blocked(&self, blocked: bool) {
        if let Ok(mut names) = self.names.lock() {
            names.blocked = blocked;
        }
    }

    pub fn names(&self) -> ClientNames {
        self.names.lock().map(|n| n.clone()).unwrap_or_default()
    }

    /// Seconds since its last command, and that command (for [`crate::commands::shown_name`]).
    pub fn idle_and_last(&self, now: Instant) -> (u64, Option<usize>) {
        let last =
            self.created + Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        let slot = self.last_command.load(Ordering::Relaxed);
        (
            now.saturating_duration_since(last).as_secs(),
            (slot != usize::MAX).then_some(slot),
        )
    }

    /// Asks the client's connection to close at once (`CLIENT KILL`).
    pub fn kill(&self) {
        self.raise(KILL);
    }

    /// Asks the client's connection to finish what it has in flight and close (shutdown).
    pub fn stop(&self) {
        self.raise(STOP);
    }

    fn raise(&self, signal: u8) {
        self.signals.fetch_or(signal, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Completes once the client was killed (at once if it was before).
    pub async fn killed(&self) {
        self.signalled(KILL).await
    }

    /// Completes once the client was asked to stop (at once if it was before).
    pub async fn stopped(&self) {
        self.signalled(STOP).await
    }

    async fn signalled(&self, signal: u8) {
        poll_fn(|cx| {
            // Registered before the check: a signal raised in between still wakes the task.
            self.waker.register(cx.waker());
            match self.signals.load(Ordering::SeqCst) & signal {
                0 => Poll::Pending,
                _ => Poll::Ready(()),
            }
        })
        .await
    }
}

/// The connected clients, by id.
#[derive(Debug, Default)]
pub struct Clients {
    by_id: Mutex<BTreeMap<u64, Arc<ClientHandle>>>,
}

impl Clients {
    /// Registers a connection; it stays listed until the returned registration is dropped.
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Registration {
        let handle = Arc::new(ClientHandle {
            id,
            peer,
            local,
            created: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            last_command: AtomicUsize::new(usize::MAX),
            names: Mutex::new(ClientNames {
                resp: 2,
                user: crate::auth::DEFAULT_USER.to_string(),
                ..ClientNames::default()
            }),
            signals: AtomicU8::new(0),
            waker: AtomicWaker::new(),
        });
        if let Ok(mut map) = self.by_id.lock() {
            map.insert(id, handle.clone());
        }
        Registration {
            clients: self.clone(),
            handle,
        }
    }

    /// Asks every connected client to finish what it has in flight and close.
    pub fn stop_all(&self) {
        for client in self.list() {
            client.stop();
        }
    }

    /// Every connected client, by id.
    pub fn list(&self) -> Vec<Arc<ClientHandle>> {
        self.by_id
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// A client's place in [`Clients`], removed when dropped.
#[derive(Debug)]
pub struct Registration {
    clients: Arc<Clients>,
    pub handle: Arc<ClientHandle>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut map) = self.clients.by_id.lock() {
            map.remove(&self.handle.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_client_is_listed_while_registered() {
        let clients = Arc::new(Clients::default());
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let first = clients.register(1, addr, addr);
        let second = clients.register(2, addr, addr);
        assert_eq!(clients.list().len(), 2);
        drop(first);
        let left: Vec<u64> = clients.list().iter().map(|c| c.id).collect();
        assert_eq!(left, vec![2]);
        second.handle.kill();
        tokio::time::timeout(Duration::from_secs(1), second.handle.killed())
            .await
            .expect("a kill is kept until the connection looks");
    }
}
