//! Dates without a date crate: the two conversions the runtime needs, both
//! in UTC on the proleptic Gregorian calendar (Howard Hinnant's algorithms,
//! which count years from March so that the leap day ends the year).

/// `2026-11-29T22:31:07Z` for a time in milliseconds since the Unix epoch: the
/// form of an approval's `decided_at`.
pub fn rfc3339_utc(epoch_ms: u64) -> String {
    let seconds = epoch_ms / 1000;
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60
    )
}

/// `2026-11-29T22:31:07.123Z`: `rfc3339_utc` with the milliseconds, the
/// time of a log line.
pub fn rfc3339_utc_ms(epoch_ms: u64) -> String {
    let mut text = rfc3339_utc(epoch_ms);
    text.pop();
    format!("{text}.{:03}Z", epoch_ms % 1000)
}

/// Milliseconds since the Unix epoch, now (0 on a clock before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `now_ms` as the stores keep times: a signed 64-bit column.
pub fn now_stored_ms() -> i64 {
    now_ms() as i64
}

/// The current time as `rfc3339_utc` writes it.
pub fn now_rfc3339() -> String {
    rfc3339_utc(now_ms())
}

/// Seconds since the Unix epoch of an HTTP-date in any of its three forms,
/// which a recipient must all accept (RFC 9110 §5.6.7): the IMF-fixdate
/// servers send today (`Sun, 06 Nov 1994 08:49:37 GMT`), and the obsolete
/// RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime (`Sun Nov  6
/// 08:49:37 1994`) forms older servers and proxies still send.
pub fn http_date_secs(text: &str) -> Option<u64> {
    let text = text.trim();
    let (day, month, year, clock) = match text.split_once(", ") {
        Some((weekday, rest)) if weekday.len() == 3 => {
            let mut fields = rest.split(' ');
            let date = (fields.next()?, fields.next()?, fields.next()?.parse().ok()?);
            let clock = fields.next()?;
            if fields.next()? != "GMT" || fields.next().is_some() {
                return None;
            }
            (date.0, date.1, date.2, clock)
        }
        Some((_weekday, rest)) => {
            let mut fields = rest.split(' ');
            let mut date = fields.next()?.split('-');
            let (day, month, year) = (date.next()?, date.next()?, date.next()?);
            let clock = fields.next()?;
            if date.next().is_some() || fields.next()? != "GMT" || fields.next().is_some() {
                return None;
            }
            (day, month, two_digit_year(year)?, clock)
        }
        None => {
            let mut fields = text.split_ascii_whitespace();
            let (_weekday, month, day, clock) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            let year = fields.next()?.parse().ok()?;
            if fields.next().is_some() {
                return None;
            }
            (day, month, year, clock)
        }
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    let day: u64 = day.parse().ok()?;
    let mut clock = clock.split(':').map(|f| f.parse::<u64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    // Four-digit years; the bound also keeps the arithmetic below far
    // from overflow on a hostile header.
    if clock.next().is_some()
        || !(1..=31).contains(&day)
        || !(1970..=9999).contains(&year)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, day)?;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// The year of an RFC 850 date's two digits: the latest year ending in
/// them that is not more than 50 years ahead of now, as RFC 9110 §5.6.7
/// asks.
fn two_digit_year(digits: &str) -> Option<u64> {
    if digits.len() != 2 {
        return None;
    }
    let digits: u64 = digits.parse().ok()?;
    let (this_year, _, _) = civil_from_days(now_ms() / 86_400_000);
    let year = this_year - this_year % 100 + digits;
    Some(if year > this_year + 50 {
        year - 100
    } else {
        year
    })
}

/// Days since 1970-01-01 of a date on or after it.
fn days_from_civil(year: u64, month: u64, day: u64) -> Option<u64> {
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let (era, year_of_era) = (y / 400, y % 400);
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    (era * 146_097 + day_of_era).checked_sub(719_468)
}

/// The date `days` after 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let (era, day_of_era) = (z / 146_097, z % 146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_in_retry_after_are_understood() {
        assert_eq!(http_date_secs("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date_secs("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            http_date_secs("Tue, 29 Feb 2028 12:00:05 GMT"),
            Some(1_835_438_405)
        );
        // The two obsolete forms a recipient must still accept.
        // 1994 until 2044, then 2094: the latest year ending in 94 not
        // more than 50 years ahead.
        assert_eq!(
            http_date_secs("Sunday, 06-Nov-94 08:49:37 GMT"),
            http_date_secs(&format!(
                "Sun, 06 Nov {} 08:49:37 GMT",
                two_digit_year("94").unwrap()
            ))
        );
        assert_eq!(
            http_date_secs("Sun Nov  6 08:49:37 1994"),
            Some(784_111_777)
        );
        assert_eq!(
            http_date_secs("Tuesday, 29-Feb-28 12:00:05 GMT"),
            Some(1_835_438_405)
        );
        for bad in [
            "",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37",
            "Sun Nov  6 08:49:37 1994 GMT",
            "Sun Nov  6 08:49 1994",
            "Sun, 06 Nov 600000000000 08:49:37 GMT",
            "Sun, 06 Nov 18446744073709551615 08:49:37 GMT",
        ] {
            assert_eq!(http_date_secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rfc3339_times_are_utc_calendar_dates() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(784_111_777_999), "1994-11-06T08:49:37Z");
        assert_eq!(rfc3339_utc(1_835_438_405_000), "2028-02-29T12:00:05Z");
        assert_eq!(rfc3339_utc(1_835_481_600_000), "2028-03-01T00:00:00Z");
        assert_eq!(rfc3339_utc(253_402_300_799_000), "9999-12-31T23:59:59Z");
    }

    /// The two directions agree on every day for centuries, leap days and
    /// century years included.
    #[test]
    fn days_round_trip() {
        for days in 0..200_000 {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), Some(days), "{y}-{m}-{d}");
        }
    }
}
