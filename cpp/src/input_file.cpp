// read_input_file (see bonsai/input_file.h). The kind of path is checked with stat() before the
// read: an std::ifstream opens a directory without complaint on Linux and then throws
// std::ios_base::failure ("basic_filebuf::underflow") from inside the read.
#include "bonsai/input_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sys/stat.h>

#include "bonsai/error.h"

namespace bonsai {

std::string read_input_file(const std::string& path, const std::string& what, const std::string& flag,
                            size_t max_bytes) {
    const std::string named = what + " '" + path + "'";
    if (path.empty()) throw Error(what + " path is empty; give " + flag + " the path of a file");
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        throw Error("cannot open " + named + ": " + std::strerror(errno) + "; check the path given to " + flag);
    }
    // Pipes and devices are read like files (-f /dev/stdin, -f <(command)); only directories are refused.
    if (S_ISDIR(st.st_mode)) throw Error(named + " is a directory; give " + flag + " the path of a file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot open " + named + ": " + std::strerror(errno) + "; check the path given to " + flag);
    try {
        std::string out;
        char chunk[65536];
        while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
            out.append(chunk, static_cast<size_t>(in.gcount()));
            if (out.size() > max_bytes) {
                throw Error(named + " is larger than " + std::to_string(max_bytes >> 20) + " MiB; give " + flag +
                            " a smaller file");
            }
        }
        if (in.bad()) throw Error("cannot read " + named + ": the read failed");
        return out;
    } catch (const std::ios_base::failure& e) {
        throw Error("cannot read " + named + ": " + e.what());
    }
}

}  // namespace bonsai
