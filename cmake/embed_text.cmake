# Turns a text file into a C++ source defining `const std::string_view NAMESPACE::SYMBOL` with the
# file's bytes, so that a binary carries its assets (the router's dashboard pages) and needs no
# file beside it in a container image. Run at build time by add_custom_command:
#   cmake -DIN=<file> -DOUT=<file.cpp> -DSYMBOL=<name> -DNAMESPACE=<a::b> -P embed_text.cmake
# Bytes are written as numbers, so no content (quotes, backslashes, ")delim") can break the source.
foreach(var IN ITEMS IN OUT SYMBOL NAMESPACE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_text.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 24 bytes a line keeps the generated file readable (CMake regexes have no {n}: the pattern is spelled out).
string(REPEAT "0x[0-9a-f][0-9a-f]," 24 line)
string(REGEX REPLACE "(${line})" "\\1\n" bytes "${bytes}")
get_filename_component(in_name "${IN}" NAME)
file(WRITE "${OUT}.tmp"
     "// Generated from ${in_name} by cmake/embed_text.cmake at build time; edit the source file instead.\n"
     "#include <string_view>\n\n"
     "namespace ${NAMESPACE} {\n"
     "namespace {\n"
     "const unsigned char k_bytes[${n_bytes} + 1] = {\n${bytes}0};\n"
     "}  // namespace\n"
     "extern const std::string_view ${SYMBOL};\n"
     "const std::string_view ${SYMBOL}(reinterpret_cast<const char*>(k_bytes), ${n_bytes});\n"
     "}  // namespace ${NAMESPACE}\n")
# Only a changed result touches OUT, so an unchanged asset recompiles nothing.
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
