// The dashboard's pages, router/http/assets/*.html, compiled into the binary at build time
// (cmake/embed_text.cmake; router/CMakeLists.txt): the router needs no file beside it.
#pragma once

#include <string_view>

namespace sy::router::assets {

extern const std::string_view dashboard_html;        // router/http/assets/dashboard.html
extern const std::string_view dashboard_login_html;  // router/http/assets/dashboard_login.html

}  // namespace sy::router::assets
