// Every test binary's main: the tests, then the backends and the devices the suites keep open
// closed in order (core/registry.h: shutdown_backends) while the drivers are still loaded, so no
// driver object is destroyed by a static destructor during exit().
#include <gtest/gtest.h>

#include "core/registry.h"

int main(int argc, char** argv) {
  ct::ShutdownBackendsOnReturn shutdown;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
