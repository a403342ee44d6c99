//! Schedule expressions: validation (with the argument named in every
//! refusal) and the next run time. Cron is `croner` restricted to five
//! fields, evaluated in a `chrono-tz` zone; croner follows Vixie cron
//! (day of month OR day of week) and handles DST: a local time that a
//! spring-forward skips fires at the first instant after the gap, and a
//! repeated autumn hour fires once.

use chrono::{TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use super::types::ScheduleExpression;

/// `everyMs` at least.
pub const MIN_EVERY_MS: i64 = 1000;
/// The zone when neither the schedule nor `config/server/timezone` names one.
pub const DEFAULT_TIMEZONE: &str = "UTC";

/// A refused expression: the message names the argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadExpression(pub String);

fn bad(msg: impl Into<String>) -> BadExpression {
    BadExpression(msg.into())
}

/// Checks `e` (argument `at`, e.g. `expression`) and fills in the cron
/// zone: the schedule's, else `server_zone`, else UTC.
pub fn normalize(
    e: ScheduleExpression,
    at: &str,
    server_zone: Option<&str>,
) -> Result<ScheduleExpression, BadExpression> {
    match e {
        ScheduleExpression::At { at_ms } if at_ms <= 0 => {
            Err(bad(format!("{at}.atMs must be a positive integer")))
        }
        ScheduleExpression::After { after_ms } if after_ms <= 0 => {
            Err(bad(format!("{at}.afterMs must be a positive integer")))
        }
        ScheduleExpression::Every { every_ms, .. } if every_ms < MIN_EVERY_MS => Err(bad(format!(
            "{at}.everyMs must be at least {MIN_EVERY_MS} (got {every_ms})"
        ))),
        ScheduleExpression::Every {
            anchor_ms: Some(a), ..
        } if a < 0 => Err(bad(format!("{at}.anchorMs must not be negative"))),
        ScheduleExpression::Cron { expr, timezone } => {
            let expr = expr.trim().to_owned();
            parse_cron(&expr).map_err(|m| bad(format!("{at}.expr: {m}")))?;
            let zone = timezone
                .map(|z| z.trim().to_owned())
                .filter(|z| !z.is_empty())
                .or_else(|| server_zone.map(str::to_owned))
                .unwrap_or_else(|| DEFAULT_TIMEZONE.to_owned());
            parse_zone(&zone).map_err(|m| bad(format!("{at}.timezone: {m}")))?;
            Ok(ScheduleExpression::Cron {
                expr,
                timezone: Some(zone),
            })
        }
        other => Ok(other),
    }
}

/// A five-field cron expression (minute hour day-of-month month
/// day-of-week); croner alone would also take seconds and years.
pub fn parse_cron(expr: &str) -> Result<Cron, String> {
    let fields = expr.split_whitespace().count();
    if fields != 5 {
        return Err(format!(
            "cron expression must use five fields: minute hour day-of-month month day-of-week (got {fields})"
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(expr)
        .map_err(|e| format!("invalid cron expression '{expr}': {e}"))
}

/// An IANA zone name.
pub fn parse_zone(zone: &str) -> Result<Tz, String> {
    zone.parse::<Tz>()
        .map_err(|_| format!("'{zone}' is not a valid IANA timezone"))
}

/// The first run strictly after `after_ms` (`None`: it never runs again;
/// an `at` in the past never runs). `after` counts from `after_ms`.
pub fn next_run(e: &ScheduleExpression, after_ms: i64) -> Result<Option<i64>, String> {
    match e {
        ScheduleExpression::At { at_ms } => Ok((*at_ms > after_ms).then_some(*at_ms)),
        ScheduleExpression::After { after_ms: d } => Ok(Some(after_ms + d)),
        ScheduleExpression::Every {
            every_ms,
            anchor_ms,
        } => {
            let anchor = anchor_ms.unwrap_or(after_ms);
            if after_ms < anchor {
                return Ok(Some(anchor));
            }
            let steps = (after_ms - anchor) / every_ms + 1;
            Ok(Some(anchor + steps * every_ms))
        }
        ScheduleExpression::Cron { expr, timezone } => {
            let cron = parse_cron(expr)?;
            let tz = parse_zone(timezone.as_deref().unwrap_or(DEFAULT_TIMEZONE))?;
            let start = Utc
                .timestamp_millis_opt(after_ms)
                .single()
                .ok_or_else(|| format!("{after_ms} is not a valid time"))?
                .with_timezone(&tz);
            let next = cron
                .find_next_occurrence(&start, false)
                .map_err(|e| format!("cron expression '{expr}' has no next run: {e}"))?;
            Ok(Some(next.timestamp_millis()))
        }
    }
}

/// Whether the schedule runs once (and disables itself after running).
pub fn is_one_shot(e: &ScheduleExpression) -> bool {
    matches!(
        e,
        ScheduleExpression::At { .. } | ScheduleExpression::After { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(expr: &str, tz: &str) -> ScheduleExpression {
        ScheduleExpression::Cron {
            expr: expr.into(),
            timezone: Some(tz.into()),
        }
    }

    fn ms(rfc3339: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn six_fields_are_refused_naming_five() {
        let e = normalize(cron("0 0 12 * * *", "UTC"), "expression", None).unwrap_err();
        assert!(e.0.contains("expression.expr"), "{e}");
        assert!(e.0.contains("five fields"), "{e}");
        assert!(normalize(cron("@daily", "UTC"), "expression", None).is_err());
        assert!(normalize(cron("61 * * * *", "UTC"), "expression", None).is_err());
    }

    #[test]
    fn zones_come_from_the_schedule_then_the_server_then_utc() {
        let bare = |tz: Option<&str>| ScheduleExpression::Cron {
            expr: "0 9 * * *".into(),
            timezone: tz.map(str::to_owned),
        };
        let zone = |e: ScheduleExpression| match e {
            ScheduleExpression::Cron { timezone, .. } => timezone.unwrap(),
            _ => unreachable!(),
        };
        assert_eq!(zone(normalize(bare(None), "e", None).unwrap()), "UTC");
        assert_eq!(
            zone(normalize(bare(None), "e", Some("Asia/Tokyo")).unwrap()),
            "Asia/Tokyo"
        );
        assert_eq!(
            zone(normalize(bare(Some("Europe/Madrid")), "e", Some("Asia/Tokyo")).unwrap()),
            "Europe/Madrid"
        );
        let e = normalize(bare(Some("Mars/Olympus")), "expression", None).unwrap_err();
        assert!(e.0.contains("expression.timezone"), "{e}");
    }

    #[test]
    fn every_needs_a_second_and_counts_from_its_anchor() {
        let every = |every_ms, anchor_ms| ScheduleExpression::Every {
            every_ms,
            anchor_ms,
        };
        let e = normalize(every(500, None), "expression", None).unwrap_err();
        assert!(e.0.contains("expression.everyMs"), "{e}");
        assert!(normalize(every(1000, None), "expression", None).is_ok());
        assert_eq!(next_run(&every(1000, None), 5_500).unwrap(), Some(6_500));
        assert_eq!(next_run(&every(1000, Some(0)), 5_500).unwrap(), Some(6_000));
        assert_eq!(next_run(&every(1000, Some(0)), 6_000).unwrap(), Some(7_000));
        assert_eq!(
            next_run(&every(1000, Some(9_000)), 5_500).unwrap(),
            Some(9_000)
        );
    }

    #[test]
    fn at_in_the_past_never_runs_and_after_counts_from_now() {
        let at = ScheduleExpression::At { at_ms: 1_000 };
        assert_eq!(next_run(&at, 999).unwrap(), Some(1_000));
        assert_eq!(next_run(&at, 1_000).unwrap(), None);
        let after = ScheduleExpression::After { after_ms: 250 };
        assert_eq!(next_run(&after, 1_000).unwrap(), Some(1_250));
    }

    #[test]
    fn cron_runs_in_its_zone_across_dst() {
        // 09:00 in New York is 14:00 UTC in winter, 13:00 in summer.
        let ny = cron("0 9 * * *", "America/New_York");
        assert_eq!(
            next_run(&ny, ms("2026-01-10T15:00:00Z")).unwrap(),
            Some(ms("2026-01-11T14:00:00Z"))
        );
        assert_eq!(
            next_run(&ny, ms("2026-07-10T15:00:00Z")).unwrap(),
            Some(ms("2026-07-11T13:00:00Z"))
        );
        // 02:30 does not exist in Madrid on 2026-03-29: it fires at 03:00
        // CEST (01:00 UTC), then at 02:30 CEST the next day.
        let madrid = cron("30 2 * * *", "Europe/Madrid");
        let first = next_run(&madrid, ms("2026-03-28T12:00:00Z"))
            .unwrap()
            .unwrap();
        assert_eq!(first, ms("2026-03-29T01:00:00Z"));
        assert_eq!(
            next_run(&madrid, first).unwrap(),
            Some(ms("2026-03-30T00:30:00Z"))
        );
        // Strictly after: an instant that matches is not its own next run.
        let utc = cron("*/15 * * * *", "UTC");
        assert_eq!(
            next_run(&utc, ms("2026-01-01T00:15:00Z")).unwrap(),
            Some(ms("2026-01-01T00:30:00Z"))
        );
    }
}
