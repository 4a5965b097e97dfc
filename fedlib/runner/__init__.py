"""The notebook runner (profiles, parameter specifications, papermill), the book's Sphinx
extension, and the repository paths (the only code that knows where things live)."""
