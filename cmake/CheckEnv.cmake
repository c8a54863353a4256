cmake_policy(SET CMP0057 NEW)
# Fails when code outside the Env's implementation touches the filesystem
# directly (docs/architecture.md, "The filesystem seam"). Every file
# operation goes through an Env (blockio/env.h) so that tests can fail it or
# stop it anywhere; this check keeps it so.
#
# Scanned: every .cc and .h of blockio, formats, pipeline, orchestrate, cli,
# bench, fuzz and nbdkit, and of their subfolders one level down (orchestrate's rooms).
# Exempt:
#   blockio/env_posix.cc, blockio/file.cc, blockio/uring.cc: the Env's
#     POSIX implementation and the file backends behind its sources/sinks;
#   *_test.cc and tests/: tests build and inspect trees directly.
# Forbidden (code only: // and /* */ comments, string and raw string
# literals are skipped):
#   - calls of the POSIX/C functions that name, open, sync, lock, stat,
#     list or change files: open openat openat2 creat rename renameat
#     renameat2 link linkat symlink symlinkat readlink readlinkat unlink
#     unlinkat mkdir mkdirat rmdir mkdtemp mkstemp mkostemp tmpfile fsync
#     fdatasync syncfs sync_file_range flock fcntl lockf stat lstat fstat
#     fstatat statx statvfs fstatvfs statfs fstatfs access faccessat chown
#     lchown fchown fchownat chmod fchmod fchmodat truncate ftruncate
#     opendir fdopendir readdir scandir nftw realpath fopen freopen, whether
#     written bare, as ::name or std::name (a method such as env.Rename()
#     or sink->Truncate() is fine);
#   - std::filesystem in any form (<filesystem>, std::filesystem::...), and
#     the file streams (fstream, ifstream, ofstream);
#   - #include "blockio/file.h" outside blockio/ (its OpenFileSource and
#     OpenFileSink bypass the Env: use Env::OpenSource/OpenSink);
#   - Env::Default() outside cli/ and nbdkit/ (the programs pick the Env:
#     barge, and barge's nbdkit plugin; library code takes an Env& from its
#     caller).
set(layers "blockio;formats;pipeline;orchestrate;cli;bench;fuzz;nbdkit")
set(exempt "blockio/env_posix.cc;blockio/file.cc;blockio/uring.cc")
set(calls "open|openat|openat2|creat|rename|renameat|renameat2|link|linkat|symlink|symlinkat|readlink|readlinkat|unlink|unlinkat|mkdir|mkdirat|rmdir|mkdtemp|mkstemp|mkostemp|tmpfile|fsync|fdatasync|syncfs|sync_file_range|flock|fcntl|lockf|stat|lstat|fstat|fstatat|statx|statvfs|fstatvfs|statfs|fstatfs|access|faccessat|chown|lchown|fchown|fchownat|chmod|fchmod|fchmodat|truncate|ftruncate|opendir|fdopendir|readdir|scandir|nftw|realpath|fopen|freopen")
# A call: the name not preceded by a letter, digit, '_', '.' or '>' (a
# member or a longer name), optionally qualified by :: or std::.
set(call_regex "(^|[^A-Za-z0-9_.>])(::|std::)?(${calls})[ \t]*\\(")
set(other_regex "std::filesystem|<filesystem>|fstream|#include \"blockio/file\\.h\"|Env::Default\\(")
# Lines worth a closer look: anything matching above, and anything that
# opens or closes a comment block or a raw string (to track them).
set(prefilter "(${calls})[ \t]*\\(|${other_regex}|/\\*|\\*/|R\"[^(\" ]*\\(|\\)[^)\" ]*\"")

set(failed FALSE)
foreach(layer IN LISTS layers)
  file(GLOB files "${ROOT}/${layer}/*.h" "${ROOT}/${layer}/*.cc"
                   "${ROOT}/${layer}/*/*.h" "${ROOT}/${layer}/*/*.cc")
  foreach(f IN LISTS files)
    file(RELATIVE_PATH rel "${ROOT}" "${f}")
    if(rel IN_LIST exempt OR f MATCHES "_test\\.cc$")
      continue()
    endif()
    file(STRINGS "${f}" lines REGEX "${prefilter}")
    set(in_block FALSE)   # inside /* ... */
    set(raw_end "")       # inside a raw string ending with this text
    foreach(line IN LISTS lines)
      set(code "${line}")
      if(NOT raw_end STREQUAL "")
        string(FIND "${code}" "${raw_end}" at)
        if(at EQUAL -1)
          continue()
        endif()
        string(LENGTH "${raw_end}" n)
        math(EXPR at "${at} + ${n}")
        string(SUBSTRING "${code}" ${at} -1 code)
        set(raw_end "")
      endif()
      if(in_block)
        string(FIND "${code}" "*/" at)
        if(at EQUAL -1)
          continue()
        endif()
        math(EXPR at "${at} + 2")
        string(SUBSTRING "${code}" ${at} -1 code)
        set(in_block FALSE)
      endif()
      # Raw strings: each one that opens here is cut out up to its end, on
      # this line or a later one.
      while(code MATCHES "R\"([^(\" ]*)\\(")
        set(close ")${CMAKE_MATCH_1}\"")
        string(FIND "${code}" "${CMAKE_MATCH_0}" open_at)
        string(SUBSTRING "${code}" 0 ${open_at} head)
        string(LENGTH "${CMAKE_MATCH_0}" n)
        math(EXPR open_at "${open_at} + ${n}")
        string(SUBSTRING "${code}" ${open_at} -1 tail)
        string(FIND "${tail}" "${close}" close_at)
        if(close_at EQUAL -1)
          set(raw_end "${close}")
          set(code "${head}")
          break()
        endif()
        string(LENGTH "${close}" n)
        math(EXPR close_at "${close_at} + ${n}")
        string(SUBSTRING "${tail}" ${close_at} -1 tail)
        set(code "${head}\"\"${tail}")
      endwhile()
      # Character and string literals, then comments.
      string(REGEX REPLACE "'(\\\\.|[^'\\\\])'" "' '" code "${code}")
      string(REGEX REPLACE "\"(\\\\.|[^\"\\\\])*\"" "\"\"" code "${code}")
      string(REGEX REPLACE "//.*" "" code "${code}")
      string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " code "${code}")
      if(code MATCHES "/\\*")
        set(in_block TRUE)
        string(REGEX REPLACE "/\\*.*" "" code "${code}")
      endif()
      set(why "")
      if(code MATCHES "${call_regex}")
        set(why "calls ${CMAKE_MATCH_3}() directly")
      elseif(code MATCHES "std::filesystem|<filesystem>")
        set(why "uses std::filesystem")
      elseif(code MATCHES "fstream")
        set(why "uses a file stream")
      elseif(code MATCHES "#include \"blockio/file\\.h\"" AND NOT layer STREQUAL "blockio")
        set(why "includes blockio/file.h (opens files around the Env)")
      elseif(code MATCHES "Env::Default\\(" AND NOT layer STREQUAL "cli" AND NOT layer STREQUAL "nbdkit")
        set(why "calls Env::Default() (only cli/ picks the Env; take an Env& instead)")
      endif()
      if(NOT why STREQUAL "")
        string(STRIP "${line}" shown)
        message(SEND_ERROR "env: ${rel} ${why}: ${shown}")
        set(failed TRUE)
      endif()
    endforeach()
  endforeach()
endforeach()
if(failed)
  message(FATAL_ERROR "Env check failed: go through an Env (blockio/env.h); see cmake/CheckEnv.cmake")
endif()
