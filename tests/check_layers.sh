#!/bin/sh
# tests/check_layers.sh: the folders of src/, cli/ and include/ depend one way.
#
# Reads every `#include "..."` in src/, cli/ and include/, resolves it as the compiler does
# (the including file's folder, then -Iinclude, then -Isrc), maps the file and the header to
# their folders, and fails (exit 1) on an include against the level table below or on a
# cycle between folders, printing each one as `file:line -> header: why`.
#
# A folder of src/ is its first path component (src/cpu/x.c: cpu); the files directly in
# src/ (src/layer.c, src/layer_internal.h) count as the folder `layer`, as src/layer/ does.
# A folder may include its own files, anything of a lower level, and the folders its line
# lists after `with` (one component in several folders: they may include each other and
# count as one folder for the cycle check). `only` instead restricts a folder to the listed
# folders (and its own files). A folder missing from the table fails, so a new folder gets
# a line here. Quoted includes that resolve to no file (a generated header) are noted and
# skipped. Run from anywhere: sh tests/check_layers.sh
set -eu
cd "$(dirname "$0")/.."

# folder    level  rule            (include: the public headers, which include nothing of src/)
LEVELS='
include    -1
core        0
text        1
graph       1
dist        1
plan        2
analysis    3
cpu         4
cuda        4      with cudaexec cudagen
cudaexec    4      with cuda cudagen
cudagen     4      with cuda cudaexec
layer       5
train       6
tune        6
cli         7      only include
'

files=$(find src cli include -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.def' \) | LC_ALL=C sort)
[ -n "$files" ] || { echo "check_layers: no sources found under src/ cli/ include/" >&2; exit 1; }

# shellcheck disable=SC2086 # the file names have no spaces
LC_ALL=C awk -v levels="$LEVELS" '
function folder_of(path,   n, p) {
    n = split(path, p, "/")
    if (p[1] == "src") return (n == 2) ? "layer" : p[2]
    return p[1]
}
function normalize(path,   n, p, out, i, k, o) {
    n = split(path, p, "/"); k = 0
    for (i = 1; i <= n; i++) {
        if (p[i] == "." || p[i] == "") continue
        if (p[i] == ".." && k > 0 && o[k] != "..") { k--; continue }
        o[++k] = p[i]
    }
    out = ""
    for (i = 1; i <= k; i++) out = out (i > 1 ? "/" : "") o[i]
    return out
}
function dirname(path) { sub(/\/[^\/]*$/, "", path); return path }
function resolve(from, h,   c) {
    c = normalize(dirname(from) "/" h); if (c in exists) return c
    c = normalize("include/" h);        if (c in exists) return c
    c = normalize("src/" h);            if (c in exists) return c
    return ""
}
function node_of(f) { return (f in node) ? node[f] : f }
function shown(n,   i, s) {   # a node by name: a component of several folders as a+b+c
    if (!(n in group)) return n
    s = ""
    for (i = 1; i <= nfold; i++) if (node_of(order[i]) == n) s = s (s == "" ? "" : "+") order[i]
    return s
}
function allowed(a, b) {   # may folder a include folder b? "" when yes, else why
    if (a == b) return ""
    if (!(a in level)) return "folder " a " is not in the level table of tests/check_layers.sh"
    if (!(b in level)) return "folder " b " is not in the level table of tests/check_layers.sh"
    if (a in only) {
        if (index(" " only[a] " ", " " b " ")) return ""
        return a " may include only " only[a] " (and its own files)"
    }
    if ((a SUBSEP b) in peer) return ""
    if (level[b] < level[a]) return ""
    if (level[b] == level[a]) return a " and " b " are both level " level[a] " and not listed as one component: neither includes the other"
    return a " (level " level[a] ") includes " b " (level " level[b] "): a folder includes only lower levels"
}
BEGIN {
    nl = split(levels, L, "\n")
    for (i = 1; i <= nl; i++) {
        nf = split(L[i], w, " ")
        if (nf == 0) continue
        f = w[1]; level[f] = w[2] + 0; order[++nfold] = f
        if (nf >= 3 && w[3] == "with") {
            rep = f
            for (j = 4; j <= nf; j++) { peer[f SUBSEP w[j]] = 1; if (w[j] < rep) rep = w[j] }
            node[f] = rep; group[rep] = 1
        } else if (nf >= 3 && w[3] == "only") {
            only[f] = ""
            for (j = 4; j <= nf; j++) only[f] = only[f] (j > 4 ? " " : "") w[j]
        }
    }
    for (i = 1; i < ARGC; i++) exists[ARGV[i]] = 1
}
/^[ \t]*#[ \t]*include[ \t]*"/ {
    h = $0; sub(/^[^"]*"/, "", h); sub(/".*$/, "", h)
    nincl++
    target = resolve(FILENAME, h)
    if (target == "") { notes[++nnotes] = FILENAME ":" FNR " -> " h ": not found beside the file, in include/ or src/ (generated?): skipped"; next }
    a = folder_of(FILENAME); b = folder_of(target)
    why = allowed(a, b)
    if (why != "") { bad[++nbad] = FILENAME ":" FNR " -> " h ": " why }
    na = node_of(a); nb = node_of(b)
    if (na != nb && !((na SUBSEP nb) in edge)) {
        edge[na SUBSEP nb] = FILENAME ":" FNR " -> " h
        if (!(na in seen)) { seen[na] = 1; nodes[++nn] = na }
        if (!(nb in seen)) { seen[nb] = 1; nodes[++nn] = nb }
    }
}
END {
    for (i = 1; i <= nnotes; i++) print "note: " notes[i]
    for (i = 1; i <= nbad; i++) print bad[i]
    # cycles: folders that reach each other (transitive closure over the folder graph)
    for (i = 1; i <= nn; i++) for (j = 1; j <= nn; j++)
        if ((nodes[i] SUBSEP nodes[j]) in edge) reach[i, j] = 1
    for (k = 1; k <= nn; k++) for (i = 1; i <= nn; i++) if ((i, k) in reach)
        for (j = 1; j <= nn; j++) if ((k, j) in reach) reach[i, j] = 1
    ncyc = 0
    for (i = 1; i <= nn; i++) {
        if (done[i] || !((i, i) in reach)) continue
        members = ""; ncyc++
        for (j = 1; j <= nn; j++) if ((i, j) in reach && (j, i) in reach) { done[j] = 1; scc[j] = ncyc; members = members (members == "" ? "" : ", ") shown(nodes[j]) }
        print "cycle between folders (each reaches the others) " members ":"
        for (j = 1; j <= nn; j++) for (k = 1; k <= nn; k++)
            if (j != k && scc[j] == ncyc && scc[k] == ncyc && ((nodes[j] SUBSEP nodes[k]) in edge))
                print "  " shown(nodes[j]) " -> " shown(nodes[k]) ", e.g. " edge[nodes[j] SUBSEP nodes[k]]
    }
    printf "check_layers: %d files, %d quoted includes: %d against the level order, %d cycle%s between folders\n", ARGC - 1, nincl, nbad, ncyc, ncyc == 1 ? "" : "s"
    exit (nbad + ncyc > 0) ? 1 : 0
}' $files
