//! How results are shown: aligned tables (coloured only on a terminal
//! without `NO_COLOR`), JSON with `--json`, a spinner on long mutations.

use std::io::{IsTerminal as _, Write as _};

use chrono::{DateTime, Utc};
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, Color, ContentArrangement, Table};
use indicatif::{ProgressBar, ProgressStyle};
use outbox_core::EventStatus;
use outbox_core::admin::ActionReport;
use serde::Serialize;

use crate::error::Result;

/// Where and how to print.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output {
    /// `--json`.
    pub(crate) json: bool,
    colour: bool,
    terminal: bool,
}

impl Output {
    /// Decides colour and layout from the terminal and `NO_COLOR`.
    pub(crate) fn new(json: bool) -> Self {
        let terminal = std::io::stdout().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Output {
            json,
            colour: terminal && !no_color && !json,
            terminal,
        }
    }

    /// A table with `header`, styled for where it goes.
    pub(crate) fn table<I: IntoIterator<Item = &'static str>>(&self, header: I) -> Table {
        let mut table = Table::new();
        table.load_preset(UTF8_FULL_CONDENSED);
        if self.terminal {
            table.set_content_arrangement(ContentArrangement::Dynamic);
        } else {
            table.force_no_tty();
        }
        if self.colour {
            table.enforce_styling();
        }
        table.set_header(header);
        table
    }

    /// A status cell, coloured by how bad it is.
    pub(crate) fn status(&self, status: EventStatus) -> Cell {
        let cell = Cell::new(status.as_str());
        if !self.colour {
            return cell;
        }
        match status {
            EventStatus::Dead => cell.fg(Color::Red),
            EventStatus::Retry | EventStatus::Held => cell.fg(Color::Yellow),
            EventStatus::Sent => cell.fg(Color::Green),
            _ => cell,
        }
    }

    /// Prints `value` as pretty JSON.
    pub(crate) fn json<T: Serialize>(&self, value: &T) -> Result<()> {
        let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
        line(&text)
    }

    /// Prints what a mutation did (JSON or a sentence); warnings go to stderr.
    pub(crate) fn report(&self, report: &ActionReport) -> Result<()> {
        for warning in &report.warnings {
            warn(warning)?;
        }
        if self.json {
            return self.json(report);
        }
        let text = if report.dry_run {
            format!(
                "dry run: {} would change {} event(s); nothing changed",
                report.action, report.matched
            )
        } else {
            format!(
                "{}: {} of {} selected changed{}",
                report.action,
                report.changed,
                report.matched,
                report
                    .audit_id
                    .map(|id| format!(" (audit #{id})"))
                    .unwrap_or_default()
            )
        };
        line(&text)
    }

    /// A spinner with a count on stderr, only on a terminal and without
    /// `--json` (hidden otherwise).
    pub(crate) fn progress(&self, what: &'static str) -> ProgressBar {
        if self.json || !std::io::stderr().is_terminal() {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new_spinner().with_message(what);
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}: {pos} [{elapsed}]") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    }

    /// A progress bar to `len` on stderr, only on a terminal and without
    /// `--json` (hidden otherwise).
    pub(crate) fn bar(&self, len: u64, what: &'static str) -> ProgressBar {
        if self.json || !std::io::stderr().is_terminal() {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(len).with_message(what);
        if let Ok(style) =
            ProgressStyle::with_template("{msg}: {wide_bar} {pos}/{len} [{elapsed}, eta {eta}]")
        {
            bar.set_style(style);
        }
        bar
    }
}

/// Prints one line (or a block) on stdout.
pub(crate) fn line(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    Ok(())
}

/// Prints a table on stdout.
pub(crate) fn table(table: &Table) -> Result<()> {
    line(&table.to_string())
}

/// Prints a warning on stderr.
pub(crate) fn warn(text: &str) -> Result<()> {
    writeln!(std::io::stderr().lock(), "warning: {text}")?;
    Ok(())
}

/// A time as a table shows it.
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// An optional time.
pub(crate) fn opt_time(t: Option<DateTime<Utc>>) -> String {
    t.map(time).unwrap_or_default()
}

/// `text` cut to `max` characters.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// Seconds as `1h 2m 3s`.
pub(crate) fn age(seconds: f64) -> String {
    let whole = std::time::Duration::from_secs(seconds.max(0.0) as u64);
    humantime::format_duration(whole).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_short_text_and_marks_long_text() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(age(3723.4), "1h 2m 3s");
    }
}
