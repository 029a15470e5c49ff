//! [`Secret`]: a password as configured (the masters', `requirepass`, a user's), kept apart
//! from the modules that hold one so that each can use it without using the others.

use serde::Deserialize;

/// A password or other secret: shown as `<redacted>` by `Debug`, so it never reaches a log.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: String) -> Secret {
        Secret(secret)
    }

    /// The secret itself, for the one place that checks it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}
