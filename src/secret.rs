//! A secret string (an API key, the model's key) whose `Debug` never shows it, so a
//! configuration or a request logged whole cannot leak one.

/// A secret string whose `Debug` never shows it.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: String) -> Secret {
        Secret(s)
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}
