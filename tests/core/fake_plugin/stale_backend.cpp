// A plugin built for another backend ABI than this crosstrain's (CT_FAKE_ABI_VERSION): the
// registry must list it as unavailable, naming both versions, and never call its create().
#include <cstdlib>

extern "C" {
__attribute__((visibility("default"))) int crosstrain_backend_abi_version() {
  return CT_FAKE_ABI_VERSION;
}
__attribute__((visibility("default"))) void* crosstrain_backend_create() {
  std::abort();  // a stale plugin's vtable would not match: it must not be created
}
}
