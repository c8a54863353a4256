# Runs cmake/CheckLayers.cmake on small fixture trees written under WORK and
# checks that it passes a tree that keeps the rules and fails, naming the
# offending include, each tree that breaks one: an arrow up between
# orchestrate's rooms, a room that is below but not allowed, a file in no
# room, a folder that is not a room, and an arrow up between the top-level
# layers.
#   cmake -DCHECK=cmake/CheckLayers.cmake -DWORK=<scratch dir> -P tests/check_layers_test.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT CHECK OR NOT WORK)
  message(FATAL_ERROR "usage: cmake -DCHECK=<CheckLayers.cmake> -DWORK=<dir> -P check_layers_test.cmake")
endif()
set(failures 0)

# fixture(<name> <path> <text> [<path> <text>]...): a fresh tree WORK/<name>.
function(fixture name)
  file(REMOVE_RECURSE "${WORK}/${name}")
  set(args ${ARGN})
  list(LENGTH args n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET args ${i} path)
    list(GET args ${j} text)
    file(WRITE "${WORK}/${name}/${path}" "${text}\n")
  endforeach()
endfunction()

# expect(<name> PASS|FAIL [<text the output must contain>])
function(expect name want)
  execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK}/${name} -P ${CHECK}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps its error messages: compare with whitespace runs as one space.
  string(REGEX REPLACE "[ \t\r\n]+" " " all "${out}${err}")
  set(ok TRUE)
  if(want STREQUAL "PASS" AND NOT rc EQUAL 0)
    set(ok FALSE)
  elseif(want STREQUAL "FAIL" AND rc EQUAL 0)
    set(ok FALSE)
  endif()
  if(ARGC GREATER 2)
    string(FIND "${all}" "${ARGV2}" at)
    if(at EQUAL -1)
      set(ok FALSE)
    endif()
  endif()
  if(ok)
    message(STATUS "ok: ${name} (${want})")
  else()
    message(SEND_ERROR "FAILED: ${name}: wanted ${want} ${ARGV2}, got exit ${rc}:\n${all}")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  endif()
endfunction()

# A tree that keeps every rule: policy -> vm -> catalog -> libvirt -> base,
# a test that reaches anywhere, cli -> orchestrate -> pipeline.
fixture(good
  orchestrate/base/file_lock.h "#pragma once"
  orchestrate/libvirt/libvirt_conn.h "#include \"orchestrate/base/file_lock.h\""
  orchestrate/catalog/backup_catalog.h "#include \"orchestrate/libvirt/libvirt_conn.h\""
  orchestrate/vm/vm_backup.cc "#include \"orchestrate/vm/vm_backup.h\"\n#include \"orchestrate/catalog/backup_catalog.h\""
  orchestrate/vm/vm_backup.h "#include \"pipeline/copy.h\""
  orchestrate/policy/policy_sources.cc "#include \"orchestrate/vm/vm_backup.h\""
  orchestrate/base/file_lock_test.cc "#include \"orchestrate/policy/policy.h\""
  cli/vm_commands.cc "#include \"orchestrate/vm/vm_backup.h\"")
expect(good PASS)

# An arrow up: base/ includes policy/.
fixture(arrow_up
  orchestrate/base/hooks.cc "#include \"orchestrate/base/hooks.h\"\n#include \"orchestrate/policy/policy.h\""
  orchestrate/policy/policy.h "#pragma once")
expect(arrow_up FAIL "orchestrate/base/hooks.cc includes orchestrate/policy/policy.h: an arrow up")

# An arrow up one step, in a header: catalog/ includes vm/.
fixture(arrow_up_header
  orchestrate/catalog/backup_catalog.h "#include \"orchestrate/vm/tracker.h\"")
expect(arrow_up_header FAIL "an arrow up, catalog/ must not depend on vm/")

# Below but not allowed: snapshot/ includes vm/ (vm sits below snapshot).
fixture(sideways
  orchestrate/snapshot/snapshot.cc "#include \"orchestrate/vm/cbt.h\"")
expect(sideways FAIL "snapshot/ may include base;libvirt;catalog, not vm/")

# A file in no room, and a flat include.
fixture(flat
  orchestrate/lock_names.h "#pragma once"
  orchestrate/base/file_lock.cc "#include \"orchestrate/lock_names.h\"")
expect(flat FAIL "lock_names.h is in no room")
expect(flat FAIL "includes orchestrate/lock_names.h: not in a room")

# A folder that is not a room.
fixture(unknown_room
  orchestrate/misc/util.h "#pragma once")
expect(unknown_room FAIL "orchestrate/misc/ is not a room")

# The top-level layers still hold: pipeline/ must not include orchestrate/.
fixture(layer_up
  pipeline/copy.cc "#include \"orchestrate/base/hooks.h\"")
expect(layer_up FAIL "pipeline/ must not depend on orchestrate/")

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} check_layers case(s) failed")
endif()
