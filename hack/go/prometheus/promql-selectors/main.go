// promql-selectors prints, for every PromQL query of Grafana dashboards (JSON) and Prometheus rule files
// (YAML), the series each query selects and the labels it needs on them, as JSON on stdout:
//
//	[{"file": F, "where": "panel title" | "alert name" | "variable name", "expr": Q,
//	  "selectors": [{"metric": M, "labels": [L, ...]}]}]
//
// A selector's labels are those its matchers name, those an enclosing aggregation groups by, and those
// an enclosing binary operation matches on: a series without one of them would make the query wrong. It
// is test tooling for crates/cluster-tests/tests/monitoring.rs, which checks the labels against what the
// manager and the node agents really serve; it parses with Prometheus's own parser, so that what it
// accepts is what Prometheus accepts.
//
//	promql-selectors FILE...
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

type selector struct {
	Metric string   `json:"metric"`
	Labels []string `json:"labels"`
}

type query struct {
	File      string     `json:"file"`
	Where     string     `json:"where"`
	Expr      string     `json:"expr"`
	Selectors []selector `json:"selectors"`
}

var promql = parser.NewParser(parser.Options{})

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promql-selectors FILE... (Grafana dashboards .json, rule files .yaml)")
		os.Exit(2)
	}
	queries := []query{}
	failed := false
	for _, file := range os.Args[1:] {
		found, err := readFile(file)
		if err != nil {
			fmt.Fprintf(os.Stderr, "promql-selectors: %s: %v\n", file, err)
			failed = true
			continue
		}
		for _, q := range found {
			selectors, err := selectorsOf(q.Expr)
			if err != nil {
				fmt.Fprintf(os.Stderr, "promql-selectors: %s: %s: %v\n", file, q.Where, err)
				failed = true
				continue
			}
			q.Selectors = selectors
			queries = append(queries, q)
		}
	}
	if failed {
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(queries); err != nil {
		fmt.Fprintf(os.Stderr, "promql-selectors: %v\n", err)
		os.Exit(1)
	}
}

func readFile(file string) ([]query, error) {
	content, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(file, ".json") {
		return dashboardQueries(file, content)
	}
	groups, errs := rulefmt.Parse(content, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, errs[0]
	}
	var found []query
	for _, group := range groups.Groups {
		for _, rule := range group.Rules {
			where := rule.Alert
			if where == "" {
				where = rule.Record
			}
			found = append(found, query{File: file, Where: group.Name + "/" + where, Expr: rule.Expr})
		}
	}
	return found, nil
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboard struct {
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

func dashboardQueries(file string, content []byte) ([]query, error) {
	var d dashboard
	if err := json.Unmarshal(content, &d); err != nil {
		return nil, err
	}
	var found []query
	var walk func(panels []panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			for _, t := range p.Targets {
				found = append(found, query{File: file, Where: d.Title + "/" + p.Title, Expr: withoutVariables(t.Expr)})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		text, ok := v.Query.(string)
		if obj, isObj := v.Query.(map[string]any); isObj {
			text, ok = obj["query"].(string)
		}
		if !ok {
			return nil, fmt.Errorf("variable %s: a query that is not a string", v.Name)
		}
		// label_values(SELECTOR, LABEL): the label is needed on the selected series.
		m := labelValues.FindStringSubmatch(strings.TrimSpace(text))
		if m == nil {
			return nil, fmt.Errorf("variable %s: %q is not label_values(SELECTOR, LABEL)", v.Name, text)
		}
		expr := fmt.Sprintf("count by (%s) (%s)", m[2], withoutVariables(m[1]))
		found = append(found, query{File: file, Where: d.Title + "/$" + v.Name, Expr: expr})
	}
	return found, nil
}

var (
	rangeVariable = regexp.MustCompile(`\$\{?__[a-z_]+\}?`)
	valueVariable = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*(:[a-z]+)?\}?`)
)

// withoutVariables replaces Grafana's variables with what PromQL parses: its interval variables with a
// duration, a dashboard variable (only ever inside a label matcher's quotes) with a regular expression
// matching anything.
func withoutVariables(expr string) string {
	expr = rangeVariable.ReplaceAllString(expr, "5m")
	return valueVariable.ReplaceAllString(expr, ".*")
}

func selectorsOf(expr string) ([]selector, error) {
	parsed, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var found []selector
	var problem error
	parser.Inspect(parsed, func(node parser.Node, path []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		labels := map[string]bool{}
		metric := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				if metric == "" && m.Type.String() == "=" {
					metric = m.Value
				}
				continue
			}
			labels[m.Name] = true
		}
		if metric == "" {
			problem = fmt.Errorf("%s: a selector without a metric name", vs)
			return problem
		}
		for _, ancestor := range path {
			switch a := ancestor.(type) {
			case *parser.AggregateExpr:
				if !a.Without {
					for _, l := range a.Grouping {
						labels[l] = true
					}
				}
			case *parser.BinaryExpr:
				if a.VectorMatching != nil && a.VectorMatching.On {
					for _, l := range a.VectorMatching.MatchingLabels {
						labels[l] = true
					}
				}
			}
		}
		names := make([]string, 0, len(labels))
		for l := range labels {
			names = append(names, l)
		}
		sort.Strings(names)
		found = append(found, selector{Metric: metric, Labels: names})
		return nil
	})
	return found, problem
}
