//! Colour on the console: only on a terminal, never where `NO_COLOR` is set (no-color.org) or
//! `metrics.disable_color_printing` is on; redirected output (files, pipes, CI logs) is plain.

use std::ffi::OsStr;
use std::io::IsTerminal;

/// Whether to colour a stream: it is a terminal, `NO_COLOR` is unset or empty, and colour is
/// not disabled by the config.
pub fn color_enabled(is_terminal: bool, no_color: Option<&OsStr>, disabled: bool) -> bool {
    is_terminal && !disabled && no_color.is_none_or(|v| v.is_empty())
}

/// [`color_enabled`] for standard error (log lines, the progress bar's printed lines).
pub fn stderr_color() -> bool {
    color_enabled(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref(), false)
}

/// [`color_enabled`] for standard output.
pub fn stdout_color(disabled: bool) -> bool {
    color_enabled(std::io::stdout().is_terminal(), std::env::var_os("NO_COLOR").as_deref(), disabled)
}

/// ANSI colours for the metric lines (TorchTitan's console colouring).
#[derive(Debug, Clone, Copy)]
pub struct Palette {
    on: bool,
}

impl Palette {
    pub fn new(on: bool) -> Self {
        Self { on }
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    pub fn cyan(&self, s: &str) -> String {
        self.paint("36", s)
    }
    pub fn green(&self, s: &str) -> String {
        self.paint("32", s)
    }
    pub fn yellow(&self, s: &str) -> String {
        self.paint("33", s)
    }
    pub fn blue(&self, s: &str) -> String {
        self.paint("34", s)
    }
    pub fn magenta(&self, s: &str) -> String {
        self.paint("35", s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(color_enabled(true, None, false));
        assert!(color_enabled(true, Some(OsStr::new("")), false), "an empty NO_COLOR does not count");
        assert!(!color_enabled(true, Some(OsStr::new("1")), false));
        assert!(!color_enabled(false, None, false));
        assert!(!color_enabled(true, None, true));
        assert_eq!(Palette::new(false).green("loss"), "loss");
        assert_eq!(Palette::new(true).green("loss"), "\x1b[32mloss\x1b[0m");
    }
}
