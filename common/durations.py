"""A length of time in words, as the console writes it everywhere."""


def duration_text(seconds):
    """45 s, 16 min, 3 h 05 min, 4 days; "–" for None."""
    if seconds is None:
        return "–"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(seconds // 60, 60)
    if hours >= 48:
        return f"{hours // 24} days"
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"
