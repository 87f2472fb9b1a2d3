"""Reading and writing what lies outside the library: named and file matrices."""
