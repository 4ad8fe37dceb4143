#!/bin/sh
# doxygen's input filter (docs/Doxyfile): a header's `//` comment lines become
# `///` so that the comment above a declaration documents it. Lines that are
# already `///` and trailing comments after code are left as they are. In
# those comment lines a placeholder such as "<name>", "out_<name>" or
# "<the first error>" (lower case inside the brackets, unlike a template
# argument such as Tape<T>) is escaped, so doxygen shows it instead of
# reading an HTML tag.
exec sed -e '/^[[:space:]]*\/\//{
s|^\([[:space:]]*\)//\([^/]\)|\1///\2|
s|^\([[:space:]]*\)//$|\1///|
s|<\([a-z][^<>]*\)>|\\<\1\\>|g
}' "$1"
