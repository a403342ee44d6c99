//! dofs: the authority-side filesystem in one SQLite database.
