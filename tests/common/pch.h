// The precompiled header of the test executables (tests/CMakeLists.txt, ct_test_folder): the
// third-party and standard headers nearly every test file includes, parsed once per test
// executable instead of once per file. Parsing them was most of a test file's compile time
// (tests/train/lora_test.cpp: 13.5 s of -fsyntax-only against 19.6 s for the whole compile,
// gtest.h alone 4.9 s). Only headers that change with the toolchain belong here: a project
// header in this list would rebuild every test object whenever it changes. Each test file still
// includes what it uses; this list only makes those includes cheap.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>
