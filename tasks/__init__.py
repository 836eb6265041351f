"""Task-suite format, built-in suites (calc, coding, search), graders and difficulty filter (issue #5)."""
