#!/bin/sh
# tests/check_funcs.sh [MAX]: no function in src/ or cli/ is longer than MAX lines (150).
#
# Lists every top-level function definition of the .c and .cu files of src/ and cli/ longer
# than MAX lines, counted from the first line of its declaration (after any comment) to its
# closing brace, and fails (exit 1) if there is one. Functions are found by counting braces
# outside comments, string and character literals and preprocessor lines: a `{` at the top
# level (or inside `extern "C"` / `namespace`) whose declaration ends in `)` (and a few
# qualifiers), with no `=` outside parentheses, opens a function. Enough for this code base:
# it does not follow C++ raw strings or strings continued over lines.
# Run from anywhere: sh tests/check_funcs.sh
set -eu
cd "$(dirname "$0")/.."
MAX=${1:-150}

files=$(find src cli -type f \( -name '*.c' -o -name '*.cu' \) | LC_ALL=C sort)
[ -n "$files" ] || { echo "check_funcs: no sources found under src/ cli/" >&2; exit 1; }

# shellcheck disable=SC2086 # the file names have no spaces
LC_ALL=C awk -v max="$MAX" '
function reset_header() { header = ""; hstart = 0 }
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
# The function name of a declaration ending in its parameter list: the identifier before
# the "(" that matches the last ")" (skipping __attribute__((...)) and the like after it).
function func_name(h,   i, c, pd, name, j) {
    h = trim(h)
    while (1) {
        while (h ~ /[ \t](const|noexcept|override|final|volatile)$/) { sub(/[ \t]+[A-Za-z_]+$/, "", h); h = trim(h) }
        if (substr(h, length(h), 1) != ")") return ""
        pd = 0
        for (i = length(h); i > 0; i--) {
            c = substr(h, i, 1)
            if (c == ")") pd++
            else if (c == "(" && --pd == 0) break
        }
        if (i == 0) return ""
        j = i - 1
        while (j > 0 && substr(h, j, 1) ~ /[ \t]/) j--
        name = ""
        while (j > 0 && substr(h, j, 1) ~ /[A-Za-z0-9_:~]/) { name = substr(h, j, 1) name; j-- }
        if (name ~ /^(__attribute__|__launch_bounds__|__declspec|alignas)$/) { h = trim(substr(h, 1, j)); continue }
        return name
    }
}
function top_assign(h,   i, c, pd) {   # an "=" outside parentheses: an initializer
    pd = 0
    for (i = 1; i <= length(h); i++) {
        c = substr(h, i, 1)
        if (c == "(") pd++
        else if (c == ")") pd--
        else if (c == "=" && pd == 0) return 1
    }
    return 0
}
FNR == 1 { depth = 0; tdepth = 0; incomment = 0; cont = 0; isfunc = 0; reset_header(); nfiles++ }
{
    line = $0
    if (cont) { cont = (line ~ /\\$/); next }                         # a continued directive
    if (!incomment && line ~ /^[ \t]*#/) { cont = (line ~ /\\$/); next } # a preprocessor line
    n = length(line); i = 1
    while (i <= n) {
        c = substr(line, i, 1)
        if (incomment) {
            if (c == "*" && substr(line, i + 1, 1) == "/") { incomment = 0; i += 2 } else i++
            continue
        }
        if (c == "/" && substr(line, i + 1, 1) == "/") break
        if (c == "/" && substr(line, i + 1, 1) == "*") { incomment = 1; i += 2; continue }
        if (c == "\"" || c == "\047") {                                  # a literal, escapes kept
            q = c; i++
            while (i <= n && substr(line, i, 1) != q) i += (substr(line, i, 1) == "\\") ? 2 : 1
            i++
            if (depth == 0) { if (!hstart) hstart = FNR; header = header q q }
            continue
        }
        if (depth == 0) {
            if (c == "{") {
                h = trim(header)
                if (h ~ /(^|[^A-Za-z0-9_])(extern[ \t]*""|namespace([ \t]+[A-Za-z0-9_:]+)?)$/) { tdepth++; reset_header(); i++; continue }
                name = top_assign(h) ? "" : func_name(h)
                isfunc = (name != ""); fname = name; fstart = hstart ? hstart : FNR
                depth = 1; i++; continue
            }
            if (c == "}") { if (tdepth > 0) tdepth--; reset_header(); i++; continue }
            if (c == ";") { reset_header(); i++; continue }
            if (c !~ /[ \t]/ && !hstart) hstart = FNR
            header = header c; i++; continue
        }
        if (c == "{") depth++
        else if (c == "}" && --depth == 0) {
            if (isfunc) {
                nfuncs++
                len = FNR - fstart + 1
                if (len > max) { nlong++; long[nlong] = sprintf("%6d  %s:%d %s", len, FILENAME, fstart, fname) }
            }
            isfunc = 0; reset_header()
        }
        i++
    }
    if (depth == 0) header = header " "
}
END {
    # longest first (an insertion sort: a handful of lines)
    for (i = 2; i <= nlong; i++) { v = long[i]; for (j = i - 1; j > 0 && long[j] + 0 < v + 0; j--) long[j + 1] = long[j]; long[j + 1] = v }
    if (nlong) print "  lines  function"
    for (i = 1; i <= nlong; i++) print long[i]
    printf "check_funcs: %d files, %d functions: %d longer than %d lines\n", nfiles, nfuncs, nlong, max
    exit nlong > 0 ? 1 : 0
}' $files
