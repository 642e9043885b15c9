"""RACES atomic environments over calendar dates: `date -> date` arithmetic, and the bridges to
`int` (weekday, day of year, YYYYMMDD, ...), `bool`, `str` (weekday and month names in
lowercase, so they feed the string environments) and `int_list`, and back from `int`.

Dates are proleptic Gregorian (Python's `datetime.date`) within the `Date` type's default range,
1900-01-01 .. 2199-12-31. An environment whose result can move past an end of that range narrows
its input range instead (`_upto`, `_from`), so every value it accepts gives a valid date.
Weekdays are Monday to Friday; no calendar of holidays is used anywhere.
"""

from __future__ import annotations

import calendar
import datetime as dt

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Date, Int, IntList, Str

FIRST, LAST = Date().lo, Date().hi
D = Date()
EPOCH = dt.date(2000, 1, 1)


def _upto(days: int) -> Date:
    """Dates at least `days` days before the end of the range (for mappers that add up to that)."""
    return Date(hi=LAST - dt.timedelta(days=days))


def _from(days: int) -> Date:
    """Dates at least `days` days after the start of the range."""
    return Date(lo=FIRST + dt.timedelta(days=days))


def _month_ends_half_the_time(rng, level):
    d = D.sample(rng, level)
    if rng.random() < 0.5:
        d = d.replace(day=calendar.monthrange(d.year, d.month)[1])
    return d


# date -> date


@atomic("dates", _upto(30), D, "Add 30 days to the input date.")
def add_30_days(d):
    import datetime

    return d + datetime.timedelta(days=30)


@atomic("dates", _from(100), D, "Subtract 100 days from the input date.")
def subtract_100_days(d):
    import datetime

    return d - datetime.timedelta(days=100)


@atomic("dates", _upto(1000), D, "Add 1000 days to the input date.")
def add_1000_days(d):
    import datetime

    return d + datetime.timedelta(days=1000)


@atomic("dates", _upto(21), D, "Add 3 weeks (21 days) to the input date.")
def add_3_weeks(d):
    import datetime

    return d + datetime.timedelta(weeks=3)


@atomic(
    "dates",
    _upto(7),
    D,
    "Give the first Monday strictly after the input date (a Monday gives the Monday one week"
    " later).",
)
def next_monday(d):
    import datetime

    return d + datetime.timedelta(days=7 - d.weekday())


@atomic(
    "dates",
    _from(7),
    D,
    "Give the last Friday strictly before the input date (a Friday gives the Friday one week"
    " earlier).",
)
def previous_friday(d):
    import datetime

    return d - datetime.timedelta(days=(d.weekday() - 4) % 7 or 7)


@atomic("dates", D, D, "Give the last day of the input date's month.")
def last_day_of_month(d):
    import calendar

    return d.replace(day=calendar.monthrange(d.year, d.month)[1])


@atomic("dates", D, D, "Give the first day of the input date's month.")
def first_day_of_month(d):
    return d.replace(day=1)


@atomic(
    "dates",
    Date(hi=dt.date(2199, 11, 30)),
    D,
    "Give the first day of the month after the input date's month.",
)
def first_day_of_next_month(d):
    import datetime

    return datetime.date(d.year + d.month // 12, d.month % 12 + 1, 1)


@atomic(
    "dates",
    Date(hi=dt.date(2199, 11, 30)),
    D,
    "Give the date one month after the input: the same day of the month in the next month, or"
    " that month's last day if it is too short (so 2023-01-31 gives 2023-02-28).",
)
def same_day_next_month(d):
    import calendar
    import datetime

    y, m = d.year + d.month // 12, d.month % 12 + 1
    return datetime.date(y, m, min(d.day, calendar.monthrange(y, m)[1]))


@atomic(
    "dates",
    Date(lo=dt.date(1900, 2, 1)),
    D,
    "Give the date one month before the input: the same day of the month in the previous month,"
    " or that month's last day if it is too short (so 2023-03-31 gives 2023-02-28).",
)
def same_day_previous_month(d):
    import calendar
    import datetime

    y, m = (d.year, d.month - 1) if d.month > 1 else (d.year - 1, 12)
    return datetime.date(y, m, min(d.day, calendar.monthrange(y, m)[1]))


@atomic(
    "dates",
    Date(hi=dt.date(2198, 12, 31)),
    D,
    "Give the date one year after the input: the same month and day in the next year, except"
    " that February 29 becomes February 28.",
)
def same_day_next_year(d):
    import datetime

    day = 28 if (d.month, d.day) == (2, 29) else d.day
    return datetime.date(d.year + 1, d.month, day)


@atomic(
    "dates",
    _upto(3),
    D,
    "Give the first weekday (Monday to Friday) strictly after the input date, skipping Saturdays"
    " and Sundays; there are no holidays.",
)
def next_business_day(d):
    import datetime

    d = d + datetime.timedelta(days=1)
    while d.weekday() >= 5:
        d = d + datetime.timedelta(days=1)
    return d


@atomic(
    "dates",
    _from(3),
    D,
    "Give the last weekday (Monday to Friday) strictly before the input date, skipping Saturdays"
    " and Sundays; there are no holidays.",
)
def previous_business_day(d):
    import datetime

    d = d - datetime.timedelta(days=1)
    while d.weekday() >= 5:
        d = d - datetime.timedelta(days=1)
    return d


@atomic(
    "dates",
    D,
    D,
    "Give the Monday of the input date's week, weeks running Monday to Sunday (a Monday gives"
    " itself).",
)
def start_of_week(d):
    import datetime

    return d - datetime.timedelta(days=d.weekday())


@atomic(
    "dates",
    _upto(6),
    D,
    "Give the Sunday of the input date's week, weeks running Monday to Sunday (a Sunday gives"
    " itself).",
)
def end_of_week(d):
    import datetime

    return d + datetime.timedelta(days=6 - d.weekday())


@atomic(
    "dates",
    D,
    D,
    "Give the first day of the input date's quarter; quarters start on January 1, April 1,"
    " July 1 and October 1.",
)
def first_day_of_quarter(d):
    import datetime

    return datetime.date(d.year, 3 * ((d.month - 1) // 3) + 1, 1)


@atomic(
    "dates",
    D,
    D,
    "Give the last day of the input date's quarter; quarters end on March 31, June 30,"
    " September 30 and December 31.",
)
def last_day_of_quarter(d):
    import datetime

    m = 3 * ((d.month - 1) // 3) + 3
    return datetime.date(d.year, m, 31 if m in (3, 12) else 30)


@atomic("dates", D, D, "Give the first Sunday of the input date's month.")
def first_sunday_of_month(d):
    import datetime

    first = d.replace(day=1)
    return first + datetime.timedelta(days=(6 - first.weekday()) % 7)


@atomic("dates", D, D, "Give the last Friday of the input date's month.")
def last_friday_of_month(d):
    import calendar
    import datetime

    last = d.replace(day=calendar.monthrange(d.year, d.month)[1])
    return last - datetime.timedelta(days=(last.weekday() - 4) % 7)


@atomic(
    "dates",
    _upto(31),
    D,
    "Add to the input date as many days as its day of the month (so 2024-03-05 gives 2024-03-10).",
)
def add_day_of_month_days(d):
    import datetime

    return d + datetime.timedelta(days=d.day)


# date -> int


@atomic(
    "dates",
    D,
    Int(0, 6),
    "Give the day of the week of the input date as a number: 0 = Monday, 1 = Tuesday, ...,"
    " 6 = Sunday.",
)
def day_of_week(d):
    return d.weekday()


@atomic(
    "dates",
    D,
    Int(1, 366),
    "Give the input date's day of the year: January 1 is 1, and December 31 is 365, or 366 in a"
    " leap year.",
)
def day_of_year(d):
    return d.timetuple().tm_yday


@atomic(
    "dates",
    D,
    Int(0, 365),
    "Count the days from the input date to December 31 of its year (0 if the input is"
    " December 31).",
)
def days_until_end_of_year(d):
    import datetime

    return (datetime.date(d.year, 12, 31) - d).days


@atomic(
    "dates",
    D,
    Int(1, 53),
    "Give the ISO 8601 week number of the input date: weeks run Monday to Sunday and week 1 is"
    " the week containing the year's first Thursday, so a date in early January can be in week"
    " 52 or 53 of the year before, and one in late December in week 1 of the next year.",
)
def iso_week_number(d):
    return d.isocalendar()[1]


@atomic(
    "dates",
    D,
    Int(19000101, 21991231),
    "Write the input date as the integer YYYYMMDD (so 2024-03-05 gives 20240305).",
)
def to_yyyymmdd(d):
    return d.year * 10000 + d.month * 100 + d.day


@atomic("dates", D, Int(28, 31), "Give the number of days in the input date's month.")
def days_in_month(d):
    import calendar

    return calendar.monthrange(d.year, d.month)[1]


@atomic(
    "dates",
    D,
    Int(1, 4),
    "Give the quarter of the input date: 1 for January to March, 2 for April to June, 3 for"
    " July to September, 4 for October to December.",
)
def quarter(d):
    return (d.month - 1) // 3 + 1


@atomic(
    "dates",
    D,
    Int((FIRST - EPOCH).days, (LAST - EPOCH).days),
    "Give the number of days from 2000-01-01 to the input date, negative if the input is"
    " earlier (2000-01-02 gives 1, 1999-12-31 gives -1).",
)
def days_since_2000(d):
    import datetime

    return (d - datetime.date(2000, 1, 1)).days


@atomic("dates", D, Int(4, 5), "Count the Sundays in the input date's month.")
def sundays_in_month(d):
    import calendar
    import datetime

    n = calendar.monthrange(d.year, d.month)[1]
    return sum(datetime.date(d.year, d.month, k).weekday() == 6 for k in range(1, n + 1))


@atomic(
    "dates",
    D,
    Int(0, 22),
    "Count the weekdays (Monday to Friday) strictly after the input date and up to the last day"
    " of its month.",
)
def weekdays_left_in_month(d):
    import calendar
    import datetime

    n = calendar.monthrange(d.year, d.month)[1]
    return sum(datetime.date(d.year, d.month, k).weekday() < 5 for k in range(d.day + 1, n + 1))


# date -> bool


@atomic(
    "dates",
    D,
    Bool(),
    "Answer true if the input date's year is a leap year (divisible by 4, except years divisible"
    " by 100 but not by 400), and false otherwise.",
)
def is_leap_year(d):
    return d.year % 4 == 0 and (d.year % 100 != 0 or d.year % 400 == 0)


@atomic(
    "dates",
    D,
    Bool(),
    "Answer true if the input date is a Saturday or a Sunday, and false otherwise.",
)
def is_weekend(d):
    return d.weekday() >= 5


@atomic(
    "dates",
    D,
    Bool(),
    "Answer true if the input date is the last day of its month, and false otherwise.",
    sampler=_month_ends_half_the_time,
)
def is_last_day_of_month(d):
    import datetime

    return (d + datetime.timedelta(days=1)).day == 1


# date -> str, int_list


@atomic(
    "dates",
    D,
    Str(min_len=6, max_len=9),
    'Give the English name of the input date\'s day of the week in lowercase, such as "monday".',
)
def weekday_name(d):
    names = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    return names[d.weekday()]


@atomic(
    "dates",
    D,
    Str(min_len=3, max_len=9),
    'Give the English name of the input date\'s month in lowercase, such as "january".',
)
def month_name(d):
    names = (
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    )
    return names[d.month - 1]


@atomic(
    "dates",
    D,
    IntList(min_len=3, max_len=3, lo=1, hi=2199),
    "Give the input date as the list [year, month, day] (so 2024-03-05 gives [2024, 3, 5]).",
)
def date_parts(d):
    return (d.year, d.month, d.day)


# int -> date


@atomic(
    "dates",
    Int((FIRST - EPOCH).days, (LAST - EPOCH).days),
    D,
    "Give the date that is the input number of days after 2000-01-01, or before it if the input"
    " is negative (0 gives 2000-01-01, -1 gives 1999-12-31).",
)
def date_from_days_since_2000(n):
    import datetime

    return datetime.date(2000, 1, 1) + datetime.timedelta(days=n)


@atomic(
    "dates",
    Int(1, 366),
    D,
    "Give the date of the input-th day of the leap year 2024, counting January 1, 2024 as day 1.",
)
def day_of_2024(n):
    import datetime

    return datetime.date(2024, 1, 1) + datetime.timedelta(days=n - 1)
