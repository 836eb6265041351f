"""Task-suite format, built-in suites (calc, coding, search), graders and difficulty filter."""
