// The least of a Slang compiler driver: the compute entry point `main` of one .slang file to
// SPIR-V 1.6, through libslang-compiler's C++ API (slangpy's wheel ships the library and slang.h
// but no slangc). Diagnostics go to stderr; exit status 1 when nothing was produced.
//   slangc_min in.slang out.spv
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "slang.h"

namespace {

void print(slang::IBlob* diagnostics) {
  if (diagnostics && diagnostics->getBufferSize())
    std::fprintf(stderr, "%s\n", static_cast<const char*>(diagnostics->getBufferPointer()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: slangc_min in.slang out.spv\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "slangc_min: cannot read %s\n", argv[1]);
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str();

  slang::IGlobalSession* global = nullptr;
  if (SLANG_FAILED(slang::createGlobalSession(&global))) {
    std::fprintf(stderr, "slangc_min: no Slang global session\n");
    return 1;
  }
  slang::TargetDesc target{};
  target.format = SLANG_SPIRV;
  target.profile = global->findProfile("spirv_1_6");
  slang::SessionDesc desc{};
  desc.targets = &target;
  desc.targetCount = 1;
  slang::ISession* session = nullptr;
  if (SLANG_FAILED(global->createSession(desc, &session))) return 1;

  slang::IBlob* diagnostics = nullptr;
  slang::IModule* module =
      session->loadModuleFromSourceString("probe", argv[1], source.c_str(), &diagnostics);
  print(diagnostics);
  if (!module) return 1;
  slang::IEntryPoint* entry = nullptr;
  if (SLANG_FAILED(module->findEntryPointByName("main", &entry))) {
    std::fprintf(stderr, "slangc_min: %s has no entry point 'main'\n", argv[1]);
    return 1;
  }
  slang::IComponentType* parts[] = {module, entry};
  slang::IComponentType* program = nullptr;
  session->createCompositeComponentType(parts, 2, &program, &diagnostics);
  print(diagnostics);
  if (!program) return 1;
  slang::IComponentType* linked = nullptr;
  program->link(&linked, &diagnostics);
  print(diagnostics);
  if (!linked) return 1;
  slang::IBlob* code = nullptr;
  linked->getEntryPointCode(0, 0, &code, &diagnostics);
  print(diagnostics);
  if (!code) return 1;
  std::ofstream out(argv[2], std::ios::binary);
  out.write(static_cast<const char*>(code->getBufferPointer()),
            static_cast<std::streamsize>(code->getBufferSize()));
  std::printf("slangc_min: %s -> %s, %zu bytes\n", argv[1], argv[2],
              static_cast<size_t>(code->getBufferSize()));
  return out ? 0 : 1;
}
