-- wrk script: POST one scoring body over and over, retrying at once whatever the answer (no Retry-After honoured).
-- SPINF_LOAD_BODY: the body's file. SPINF_LOAD_EXPECT (optional): the file of the "results" JSON the same call gets
-- alone; every 200 is checked against it byte for byte. Prints one "key value" line per count when done.

local function read(path)
  local file = assert(io.open(path, "rb"))
  local text = file:read("*a")
  file:close()
  return text
end

wrk.method = "POST"
wrk.body = read(os.getenv("SPINF_LOAD_BODY"))
wrk.headers["Content-Type"] = "application/json"
local expect_path = os.getenv("SPINF_LOAD_EXPECT")
local expected = expect_path and read(expect_path) or nil
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  counts = {}
end

local function count(key)
  counts[key] = (counts[key] or 0) + 1
end

function response(status, headers, body)
  count("status_" .. status)
  if status == 429 or status == 503 then
    if not (headers["Retry-After"] or headers["retry-after"]) then
      count("missing_retry_after")
    end
  elseif status ~= 200 then
    count("unexpected_status")
  elseif expected then
    local first = body:find('"results": ', 1, true)
    local last = first and body:find(', "warnings": ', first, true)
    if not last or body:sub(first + 11, last - 1) ~= expected then
      count("mismatch")
    end
  end
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for key, value in pairs(thread:get("counts")) do
      total[key] = (total[key] or 0) + value
    end
  end
  total["timeouts"] = summary.errors.timeout
  total["connect_errors"] = summary.errors.connect
  total["read_errors"] = summary.errors.read
  total["duration_s"] = summary.duration / 1e6
  for key, value in pairs(total) do
    io.write(string.format("%s %s\n", key, value))
  end
end
