#!/bin/sh
# doxygen's input filter (docs/Doxyfile): a header's `//` comment lines become
# `///` so that the comment above a declaration documents it. Lines that are
# already `///` and trailing comments after code are left as they are.
exec sed -e 's|^\([[:space:]]*\)//\([^/]\)|\1///\2|' -e 's|^\([[:space:]]*\)//$|\1///|' "$1"
