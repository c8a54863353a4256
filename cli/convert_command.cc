// barge convert (placeholder until the pipeline lands).
#include "cli/common.h"

namespace barge::cli {

void RegisterConvertCommand(CLI::App& app, int& exit_code) {}

}  // namespace barge::cli
